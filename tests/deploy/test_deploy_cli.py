"""`taskrl serve` as a process: 50 concurrent openai sessions, SIGKILL mid-load, restart, consistent store."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from taskrl.deploy.store import InteractionStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(db: Path, port: int) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "taskrl.cli", "serve", "--policy", "scripted", "--env", "shop", "--name", "shop",
        "--store", f"sqlite:///{db}", "--api-key", "k:tenant", "--port", str(port),
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
        if proc.poll() is not None:
            raise AssertionError(f"taskrl serve exited: {proc.stderr.read() if proc.stderr else ''}")
    proc.kill()
    raise AssertionError("taskrl serve did not become healthy in 60 s")


async def test_kill_mid_load_then_restart(tmp_path: Path) -> None:
    db, port = tmp_path / "serve.db", free_port()
    proc = start(db, port)
    acknowledged: list[str] = []
    try:
        oa = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=30)

        async def session(i: int) -> None:
            messages = [{"role": "user", "content": "How much do 2 apples cost?"}]
            for _ in range(1000):
                try:
                    reply = await oa.chat.completions.create(
                        model="shop", messages=messages, extra_headers={"x-session-id": f"s{i}"}
                    )
                except openai.APIError:
                    return  # the server was killed
                acknowledged.append(reply.id)

        sessions = [asyncio.create_task(session(i)) for i in range(50)]
        while len(acknowledged) < 150:
            await asyncio.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.gather(*sessions)
        await oa.close()
    finally:
        proc.kill()
        proc.wait(10)
    proc = start(db, port)  # the restarted server opens the same store and serves again
    try:
        reply = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
        ).chat.completions.create(model="shop", messages=[{"role": "user", "content": "How much do 2 apples cost?"}])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    with InteractionStore(f"sqlite:///{db}") as store:
        ids = [r.id for r in store.interactions()]
    assert set(acknowledged) <= set(ids), "an acknowledged response is missing from the store"
    assert len(ids) == len(set(ids)) and reply.id in ids
    assert len(ids) - len(acknowledged) - 1 <= 50  # at most the in-flight requests were logged but not received

"""Issue 16 (delivery and durability) and issue 13 item 3 (cancellation, time limit), for real.

A client that hangs up or a request past the time limit cancels its generation and logs nothing; a PostgreSQL
outage loses no delivered response (spooled and replayed, or refused when fail-closed); ``taskrl serve`` drains
on SIGTERM. Real tiny model, real server, real PostgreSQL (stopped and restarted), real ``taskrl serve`` process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from taskrl.chat import ChatFormat
from taskrl.deploy.config import ServeConfig
from taskrl.deploy.dataset import trajectories_from_store
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.spool import Spool
from taskrl.deploy.store import Feedback, Interaction, InteractionStore
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import smollm2_tokenizer, tiny_model
from taskrl.policies.scripted import ScriptedPolicy

LONG = {"model": "tiny", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 6000, "temperature": 1.0,
        "seed": 0}
"""Tens of seconds of decoding for the tiny model (a few ms per token on an idle CPU): far past the 0.3-0.5 s limits
of these tests, and long enough that a client polling ``/metrics`` on a loaded machine still hangs up mid-decode
(1,500 tokens once finished first: 2.6 s idle). Seeded, so no early stop token can end it by chance (a 49k-token
vocabulary with two stop tokens ends 1,500 unseeded tokens early about 6% of the time)."""
CONTEXT = 8192  # room for LONG's prompt and 6,000 new tokens in the tiny model


def metric(url: str, name: str) -> float:
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=30).text  # httpx's 5 s default: short if loaded
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def wait_until(check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_a_client_that_hangs_up_cancels_its_generation_and_is_not_logged(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0, max_position_embeddings=CONTEXT)
    policy = HFPolicy(model, tokenizer, device="cpu")
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}", sqlite_synchronous="NORMAL") as store:
        with running_server(create_app({"tiny": policy}, store=store)) as url:

            async def hang_up() -> None:  # once the server is generating for it, however long that took to happen
                impatient = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)
                call = asyncio.ensure_future(impatient.chat.completions.create(**LONG))
                while metric(url, "taskrl_generation_queue_depth") < 1:
                    await asyncio.sleep(0.05)
                call.cancel()  # the client goes away: httpx drops the connection mid-request
                with pytest.raises(asyncio.CancelledError):
                    await call
                await impatient.close()

            asyncio.run(hang_up())
            wait_until(lambda: metric(url, 'taskrl_events_total{event="cancelled"') == 1)
            patient = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)
            after = patient.chat.completions.create(**{**LONG, "max_tokens": 3})
            ready = httpx.get(url.removesuffix("/v1") + "/ready", timeout=30).json()
        rows = store.interactions()
    assert [r.id for r in rows] == [after.id] and ready["in_flight"] == 0


def test_the_generation_time_limit_answers_504_and_logs_nothing(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0, max_position_embeddings=CONTEXT)
    policy = HFPolicy(model, tokenizer, device="cpu")
    config = ServeConfig(generation_timeout_s=0.3)
    with InteractionStore(f"sqlite:///{tmp_path / 's.db'}", sqlite_synchronous="NORMAL") as store:
        with running_server(create_app({"tiny": policy}, store=store, config=config)) as url:
            oa = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=120)
            with pytest.raises(openai.InternalServerError) as timed_out:
                oa.chat.completions.create(**LONG)
            assert timed_out.value.status_code == 504 and timed_out.value.code == "timeout"
        assert store.count() == 0


def test_undelivered_rows_are_marked_and_never_trained_on(store_url: str) -> None:
    with InteractionStore(store_url) as store:
        for i in range(2):
            request = {"messages": [{"role": "user", "content": "hi"}]}
            row = Interaction("t", f"s{i}", "m", 0, request, {"message": {"content": "x"}}, [5, 6], [-1.0, -1.0],
                              [1, 2, 3], id=f"int_{i}")  # fmt: skip
            store.add_sync("interactions", row)
            store.add_sync("feedback", Feedback(row.id, "t", "accepted"))
        store.mark_undelivered("int_0").result(30)
        rows = {r.id: r.delivered for r in store.interactions()}
        trajectories, stats = trajectories_from_store(store, group_by="none")
    assert rows == {"int_0": False, "int_1": True}
    assert [t.id for t in trajectories] == ["int_1"] and stats.undelivered == 1


def test_rows_a_previous_process_spooled_are_replayed_once(store_url: str, tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    row = Interaction("t", "s", "m", 0, {"messages": []}, {"message": {}}, [1], [-0.5], [2], id="int_spooled")
    fields = {k: getattr(row, k) for k in row.__dataclass_fields__}
    spool.append([("interactions", fields), ("interactions", fields)])  # a crash mid-replay leaves doubles
    with InteractionStore(store_url, spool_path=tmp_path / "spool.jsonl") as store:
        store.add_sync("feedback", Feedback("int_spooled", "t", "accepted"))  # the first write replays first
        assert [r.id for r in store.interactions()] == ["int_spooled"] and store.spool.rows == 0


def scripted_app(store: InteractionStore) -> Any:
    policy = ScriptedPolicy(lambda messages, tools: "ok", name="agent", chat_format=ChatFormat(smollm2_tokenizer()))
    return create_app({"agent": policy}, store=store, config=ServeConfig(api_keys={"k": "t"}))


async def traffic(url: str, n: int) -> list[Any]:
    oa = openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0, timeout=60)
    calls = [
        oa.chat.completions.with_raw_response.create(model="agent", messages=[{"role": "user", "content": f"q{i}"}])
        for i in range(n)
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)
    await oa.close()
    return results


@pytest.mark.parametrize("mode", ["spool", "fail_closed"])
async def test_a_postgresql_outage_loses_no_delivered_response(own_postgres: Any, tmp_path: Path, mode: str) -> None:
    url = own_postgres.new_database()
    spool = tmp_path / "spool.jsonl" if mode == "spool" else None
    delivered: list[str] = []
    with InteractionStore(url, spool_path=spool) as store:
        with running_server(scripted_app(store)) as base_url:
            before = await traffic(base_url, 20)
            own_postgres.stop()  # the outage
            during = await traffic(base_url, 40)
            own_postgres.start()
            for result in before + during:
                if isinstance(result, Exception):
                    assert mode == "fail_closed" and isinstance(result, openai.InternalServerError), result
                    assert result.status_code == 503 and result.code == "store_unavailable"
                    continue
                delivered.append(result.parse().id)
                assert result.headers["x-logged"] in ("true", "spooled")
            if mode == "spool":
                assert sum(r.headers["x-logged"] == "spooled" for r in during if not isinstance(r, Exception)) == 40
                wait_until(lambda: store.spool.rows == 0, 60)  # replayed once the database answers
            after = await traffic(base_url, 5)
            delivered += [r.parse().id for r in after]
        stored = [r.id for r in store.interactions()]
    assert len(stored) == len(set(stored))  # nothing doubled
    assert set(delivered) == set(stored)  # nothing delivered is missing, nothing refused was stored
    assert len(delivered) == (65 if mode == "spool" else 25)


def test_taskrl_serve_drains_on_sigterm(tmp_path: Path) -> None:
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(tmp_path / "tiny"))
    tokenizer.save_pretrained(str(tmp_path / "tiny"))
    port = _free_port()
    env = {**os.environ, "TASKRL_API_KEYS": "k1:alpha,k2:beta", "TASKRL_ADMIN_KEY": "adm"}
    db = tmp_path / "s.db"
    cmd = [sys.executable, "-m", "taskrl.cli", "serve", "--policy", "hf", "--model", str(tmp_path / "tiny"),
           "--name", "tiny", "--store", f"sqlite:///{db}", "--port", str(port), "--device", "cpu",
           "--spool", str(tmp_path / "spool.jsonl")]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _up(root), 120)
        assert "k1" not in " ".join(cmd)  # keys came from the environment, not the process list
        lora = httpx.post(root + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path)},
                          headers={"Authorization": "Bearer adm"}, timeout=30)  # fmt: skip
        assert lora.status_code == 403 and lora.json()["error"]["code"] == "runtime_lora_disabled"

        async def scenario() -> tuple[list[Any], list[int], list[int]]:
            oa = openai.AsyncOpenAI(base_url=root + "/v1", api_key="k1", max_retries=0, timeout=120)
            body = {**LONG, "max_tokens": 16}
            flight = [asyncio.create_task(oa.chat.completions.create(**body)) for _ in range(30)]
            async with httpx.AsyncClient() as http:
                while (await http.get(root + "/ready")).json().get("in_flight", 0) < 30:
                    await asyncio.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
                ready, refused = [], []
                for _ in range(3):
                    await asyncio.sleep(0.1)
                    ready.append((await http.get(root + "/ready")).status_code)
                    late = await http.post(root + "/v1/chat/completions", json={**body, "max_tokens": 2},
                                           headers={"Authorization": "Bearer k2"})  # fmt: skip
                    refused.append(late.status_code)
            results = await asyncio.gather(*flight, return_exceptions=True)
            await oa.close()
            return results, ready, refused

        results, ready, refused = asyncio.run(scenario())
        assert proc.wait(60) == 0, proc.stdout.read().decode() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert all(not isinstance(r, Exception) for r in results), results
    assert set(ready) == {503} and set(refused) == {503}
    with InteractionStore(f"sqlite:///{db}") as store:
        assert {r.id for r in store.interactions()} == {r.id for r in results}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _up(root: str) -> bool:
    try:
        return httpx.get(root + "/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


OLD_COLUMNS = [
    "id VARCHAR(64) PRIMARY KEY",
    "tenant VARCHAR(128) NOT NULL",
    "session_id VARCHAR(256) NOT NULL",
    "model VARCHAR(256) NOT NULL",
    "policy_version INTEGER NOT NULL",
    "route VARCHAR(32) NOT NULL",
    "shadow BOOLEAN NOT NULL",
    "created_at FLOAT NOT NULL",
    "latency_ms FLOAT NOT NULL",
    "request JSON NOT NULL",
    "response JSON NOT NULL",
    "prompt_token_ids JSON",
    "completion_token_ids JSON NOT NULL",
    "logprobs JSON NOT NULL",
    "tool_calls JSON NOT NULL",
]


def test_a_database_from_before_issue_16_opens_and_reads(store_url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(store_url)
    with engine.begin() as conn:  # the first schema: no sampling, no delivered column
        conn.execute(sa.text(
            "CREATE TABLE interactions (" + ", ".join(OLD_COLUMNS) + ")"
        ))  # fmt: skip
        conn.execute(sa.text(
            "INSERT INTO interactions VALUES ('int_old', 't', 's', 'm', 0, 'stable', false, 1.0, 1.0,"
            " '{\"messages\": [], \"temperature\": 0.5}', '{}', '[1]', '[2]', '[-0.5]', '[]')"
        ))  # fmt: skip
    engine.dispose()
    with InteractionStore(store_url) as store:
        old = store.interactions()[0]
        store.add_sync("interactions", Interaction("t", "s", "m", 0, {}, {}, [1], [-1.0], [2], id="int_new"))
        assert (old.delivered, old.sampling) == (True, None) and store.count() == 2
        from taskrl.deploy.dataset import row_temperature

        assert row_temperature(old) == 0.5  # the request's temperature when no sampling was recorded


async def test_a_stream_the_transport_drops_is_marked_undelivered(store_url: str) -> None:
    """The real app with a transport that fails mid-stream (the client's socket is gone): the row stays, flagged
    (SQLite and PostgreSQL), and the server holds nothing for it afterwards (no request in flight)."""
    import json as json_module

    with InteractionStore(store_url) as store:
        app = scripted_app(store)
        body = json_module.dumps({"model": "agent", "messages": [{"role": "user", "content": "q"}], "stream": True})
        sent_body = False
        started: list[int] = []

        async def receive() -> dict:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body.encode(), "more_body": False}
            await asyncio.sleep(3600)  # the client never says goodbye: its socket just breaks
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                started.append(message["status"])
            elif message.get("body"):
                raise OSError("connection reset by peer")

        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
            "root_path": "", "headers": [(b"content-type", b"application/json"), (b"authorization", b"Bearer k"),
                                         (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {},
        }  # fmt: skip
        await app(scope, receive, send)
        wait_until(lambda: len(store.interactions()) == 1 and not store.interactions()[0].delivered, 30)
        rows = store.interactions()
        store.add_sync("feedback", Feedback(rows[0].id, "t", "accepted"))  # even an accepted one is not trained on
        trajectories, stats = trajectories_from_store(store, group_by="none")
    assert started == [200] and len(rows) == 1 and rows[0].delivered is False
    assert trajectories == [] and stats.undelivered == 1
    assert app.state.in_flight == 0 and app.state.metrics.in_flight._value.get() == 0

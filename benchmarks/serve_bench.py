"""Serving benchmark: 100 concurrent tool-using sessions through the real ``openai`` client on loopback.

Prints, side by side: the policy called directly vs through the server (p50 latency per turn), the p50 server
overhead beyond the policy (auth, routing, exact-token logging; target <= 5 ms), lost or duplicated
interactions in the store (target 0), and raw interactions/s into SQLite (FULL and NORMAL sync).
The policy is a ScriptedPolicy with the SmolLM2 chat format, so the numbers measure taskrl, not a model.

``--poisoned`` (issue 16) runs the load test instead: a tiny random HFPolicy (real sampling, real shared decode
batches), 100 concurrent sessions of a well-behaved tenant beside a misbehaving tenant that sends poisoned
parameters (seed 2**64, temperature 1e-40, NaN, top_p 0, context overflow, logit_bias, unknown forced tools,
malformed or 5,000-deep JSON, feedback floods). Prints, side by side, the good tenant's p50 alone vs under
attack, its failed requests (target 0), and lost / duplicated / non-finite interactions in the store (target 0).

    .venv/bin/python benchmarks/serve_bench.py [--sessions 100] [--turns 2]
    .venv/bin/python benchmarks/serve_bench.py --poisoned [--sessions 100] [--evil 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from taskrl.chat import ChatFormat
from taskrl.deploy.config import ServeConfig
from taskrl.deploy.server import create_app, generate_chat, running_server
from taskrl.deploy.store import Interaction, InteractionStore
from taskrl.policies.base import SamplingParams
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.types import Message

TOOL = {
    "type": "function",
    "function": {
        "name": "get_price",
        "description": "Price of an item.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
    },
}


def rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    if messages[-1].role == "tool":
        return f"It costs {messages[-1].content}."
    return ScriptedPolicy.call("get_price", item="apple")


async def direct_p50(policy: ScriptedPolicy, n: int) -> float:
    messages = [Message("user", "price of an apple?")]
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await generate_chat(policy, messages, [TOOL], SamplingParams(max_new_tokens=64))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def sessions(base_url: str, n_sessions: int, turns: int) -> tuple[list[float], list[float], list[str]]:
    oa = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=120)
    latencies: list[float] = []
    overheads: list[float] = []
    ids: list[str] = []

    async def session(i: int) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "price of an apple?"}]
        for _ in range(turns):
            started = time.perf_counter()
            raw = await oa.chat.completions.with_raw_response.create(
                model="shop", messages=messages, tools=[TOOL], extra_headers={"x-session-id": f"s{i}"}
            )
            latencies.append((time.perf_counter() - started) * 1000)
            overheads.append(float(raw.headers["x-overhead-ms"]))
            reply = raw.parse()
            ids.append(reply.id)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "2 EUR"})

    await asyncio.gather(*(session(i) for i in range(n_sessions)))
    await oa.close()
    return latencies, overheads, ids


async def store_rate(path: Path, synchronous: str, n: int = 5000) -> float:
    with InteractionStore(f"sqlite:///{path}", sqlite_synchronous=synchronous) as store:
        rows = [
            Interaction("t", f"s{i}", "m", 0, {"messages": []}, {}, list(range(64)), [-0.1] * 64, list(range(200)))
            for i in range(n)
        ]
        started = time.perf_counter()
        await asyncio.gather(*(store.add("interactions", r) for r in rows))
        return n / (time.perf_counter() - started)


async def main(n_sessions: int, turns: int) -> None:
    chat_format = ChatFormat(smollm2_tokenizer())
    policy = ScriptedPolicy(rule, chat_format=chat_format)
    tmp = Path(tempfile.mkdtemp(prefix="taskrl-serve-bench-"))
    direct = await direct_p50(policy, 200)
    with InteractionStore(f"sqlite:///{tmp / 'serve.db'}") as store:
        app = create_app({"shop": policy}, store=store, config=ServeConfig(api_keys={"bench": "bench"}))
        with running_server(app) as base_url:
            await sessions(base_url, 10, 1)  # warm-up
            one_at_a_time = []
            for _ in range(100):
                seq_latencies, seq_overheads, _ids = await sessions(base_url, 1, 1)
                one_at_a_time.append((seq_latencies[0], seq_overheads[0]))
            started = time.perf_counter()
            latencies, overheads, ids = await sessions(base_url, n_sessions, turns)
            wall = time.perf_counter() - started
        stored = [r.id for r in store.interactions() if r.id in set(ids)]
    lost = len(set(ids) - set(stored))
    duplicated = len(stored) - len(set(stored))
    full = await store_rate(tmp / "full.db", "FULL")
    normal = await store_rate(tmp / "normal.db", "NORMAL")
    print("one request at a time (100 requests)")
    print(f"  {'policy called directly, p50 per turn':<48} {direct:8.2f} ms")
    seq_latency = statistics.median(x for x, _ in one_at_a_time)
    seq_overhead = statistics.median(y for _, y in one_at_a_time)
    print(f"  {'through the server (client-side), p50 per turn':<48} {seq_latency:8.2f} ms")
    print(f"  {'server overhead beyond the policy, p50':<48} {seq_overhead:8.2f} ms  (target <= 5)")
    print(f"{n_sessions} concurrent sessions x {turns} turns with tool calls, openai client on loopback")
    print(f"  {'policy called directly, p50 per turn':<48} {direct:8.2f} ms")
    print(f"  {'through the server (client-side), p50 per turn':<48} {statistics.median(latencies):8.2f} ms")
    print(f"  {'server overhead incl. queueing behind others, p50':<48} {statistics.median(overheads):8.2f} ms")
    print(f"  {'server overhead, p90':<48} {statistics.quantiles(overheads, n=10)[-1]:8.2f} ms")
    print(f"  {'turns/s through the server':<48} {len(ids) / wall:8.1f}")
    print(f"  {'interactions lost / duplicated in the store':<48} {lost} / {duplicated}  (target 0 / 0)")
    print(f"  {'store writes/s, SQLite WAL synchronous=FULL':<48} {full:8.0f}")
    print(f"  {'store writes/s, SQLite WAL synchronous=NORMAL':<48} {normal:8.0f}")


POISONS: list[dict[str, Any]] = [
    {"seed": 2**64}, {"temperature": 1e-40}, {"temperature": 1e30}, {"top_p": 0.0}, {"top_k": -7},
    {"max_tokens": 10**9}, {"logit_bias": {"0": 100}}, {"presence_penalty": 2.0},
    {"response_format": {"type": "json_object"}},
    {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "rm_rf"}}},
    {"messages": [{"role": "user", "content": "spam " * 2500}]}, {"n": 5}, {"top_logprobs": 20},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "f", "arguments": '{"a": ' + "[" * 5000 + "]" * 5000 + "}"}}]},
      {"role": "tool", "tool_call_id": "c", "content": "r"}]},  # issue 18: was a RecursionError (500)
]  # fmt: skip
RAW_POISONS = [b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', b"{oops",
               b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": '
               + b"[" * 5000 + b"]" * 5000 + b"}"]  # fmt: skip


def cpu_model() -> tuple[str, bool]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    return name, "amx_bf16" in out


async def good_tenant(url: str, n_sessions: int, turns: int) -> tuple[list[float], list[str], list[BaseException]]:
    oa = openai.AsyncOpenAI(base_url=url, api_key="good", max_retries=0, timeout=600)
    latencies: list[float] = []
    ids: list[str] = []
    failures: list[BaseException] = []

    async def session(i: int) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"hello {i}"}]
        for turn in range(turns):
            started = time.perf_counter()
            try:
                reply = await oa.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=4, temperature=0.7, seed=i * 10 + turn,
                    extra_headers={"x-session-id": f"good-{i}"},
                )  # fmt: skip
            except (openai.OpenAIError, httpx.HTTPError) as exc:
                failures.append(exc)
                return
            latencies.append((time.perf_counter() - started) * 1000)
            ids.append(reply.id)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                         {"role": "user", "content": "and?"}]  # fmt: skip

    await asyncio.gather(*(session(i) for i in range(n_sessions)))
    await oa.close()
    return latencies, ids, failures


async def evil_tenant(url: str, n_sessions: int, stop: asyncio.Event) -> tuple[dict[str, int], list[str]]:
    """Poisoned requests in a loop until ``stop``; returns status counts and the ids it was served."""
    statuses: dict[str, int] = {}
    served: list[str] = []
    headers = {"Authorization": "Bearer evil", "Content-Type": "application/json"}
    base = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    async with httpx.AsyncClient(timeout=600) as http:

        async def session(i: int) -> None:
            k = i
            while not stop.is_set():
                k += 1
                if k % 5 == 0:
                    body = RAW_POISONS[k % len(RAW_POISONS)]
                else:
                    body = json.dumps({**base, **POISONS[k % len(POISONS)]}).encode()
                reply = await http.post(url + "/chat/completions", content=body,
                                        headers={**headers, "x-session-id": f"evil-{i}"})  # fmt: skip
                statuses[str(reply.status_code)] = statuses.get(str(reply.status_code), 0) + 1
                if reply.status_code == 200:
                    served.append(reply.json()["id"])
                    for _ in range(5):  # feedback flood on what it got
                        await http.post(url + "/feedback", json={"interaction_id": served[-1], "kind": "rejected"},
                                        headers=headers)  # fmt: skip

        await asyncio.gather(*(session(i) for i in range(n_sessions)))
    return statuses, served


async def poisoned(n_sessions: int, n_evil: int, turns: int) -> None:
    from taskrl.policies.hf import HFPolicy
    from taskrl.policies.models import tiny_model

    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu")
    tmp = Path(tempfile.mkdtemp(prefix="taskrl-serve-poison-"))
    keys = {"good": "good-tenant", "evil": "evil-tenant"}
    with InteractionStore(f"sqlite:///{tmp / 'serve.db'}", spool_path=tmp / "spool.jsonl") as store:
        app = create_app({"tiny": policy}, store=store, config=ServeConfig(api_keys=keys))
        with running_server(app) as url:
            _, warm_ids, _ = await good_tenant(url, 4, 1)  # warm-up
            started = time.perf_counter()
            alone, alone_ids, alone_failures = await good_tenant(url, n_sessions, turns)
            alone_wall = time.perf_counter() - started
            stop = asyncio.Event()
            attack = asyncio.create_task(evil_tenant(url, n_evil, stop))
            await asyncio.sleep(1.0)
            started = time.perf_counter()
            attacked, ids, failures = await good_tenant(url, n_sessions, turns)
            attacked_wall = time.perf_counter() - started
            stop.set()
            statuses, evil_ids = await attack
        rows = store.interactions()
    delivered = warm_ids + alone_ids + ids + evil_ids
    stored = [r.id for r in rows]
    lost = len(set(delivered) - set(stored))
    duplicated = len(stored) - len(set(stored))
    undelivered_stored = len(set(stored) - set(delivered))
    non_finite = sum(not all(math.isfinite(x) for x in r.logprobs) for r in rows)
    name, amx = cpu_model()
    print(f"CPU: {name} (amx_bf16: {'yes' if amx else 'no'}); tiny random HFPolicy, SQLite FULL, loopback")
    header = f"{n_sessions} concurrent sessions x {turns} turns, well-behaved tenant"
    print(f"{header:<58} alone | beside {n_evil} poisoners")
    print(f"  {'p50 latency per turn (ms)':<48} {statistics.median(alone):8.0f} | {statistics.median(attacked):8.0f}")
    print(f"  {'wall time (s)':<48} {alone_wall:8.1f} | {attacked_wall:8.1f}")
    print(f"  {'failed requests (target 0)':<48} {len(alone_failures):8d} | {len(failures):8d}")
    print(f"  misbehaving tenant's requests by status: {dict(sorted(statuses.items()))}")
    print(f"  interactions lost / duplicated / stored-but-undelivered / non-finite: "
          f"{lost} / {duplicated} / {undelivered_stored} / {non_finite}  (target 0 / 0 / 0 / 0)")  # fmt: skip


async def listing(n_rows: int) -> None:
    """GET /v1/interactions?limit=1 at ``n_rows`` rows of one tenant: SQL LIMIT (now) vs read all, slice (before)."""
    tmp = Path(tempfile.mkdtemp(prefix="taskrl-serve-list-"))
    with InteractionStore(f"sqlite:///{tmp / 'list.db'}", sqlite_synchronous="NORMAL") as store:
        rows = [
            Interaction("t", f"s{i % 50}", "m", 0, {"messages": [{"role": "user", "content": "q" * 200}]},
                        {"message": {"content": "a" * 200}}, list(range(64)), [-0.1] * 64, list(range(200)))
            for i in range(n_rows)
        ]  # fmt: skip
        await asyncio.gather(*(store.add("interactions", r) for r in rows))
        app = create_app({"shop": ScriptedPolicy(rule)}, store=store, config=ServeConfig(api_keys={"k": "t"}))
        with running_server(app) as base_url, httpx.Client(timeout=120) as http:
            http.get(base_url + "/interactions", params={"limit": 1}, headers={"Authorization": "Bearer k"})
            started = time.perf_counter()
            for _ in range(10):
                page = http.get(base_url + "/interactions", params={"limit": 1}, headers={"Authorization": "Bearer k"})
            now_ms = (time.perf_counter() - started) * 100
            started = time.perf_counter()
            store.interactions(tenant="t")[-1:]  # what the endpoint did before issue 16
            before_ms = (time.perf_counter() - started) * 1000
    assert len(page.json()["data"]) == 1
    print(f"GET /v1/interactions?limit=1 with {n_rows} rows of the tenant")
    print(f"  {'before: read the history, keep the last (ms)':<48} {before_ms:8.1f}")
    print(f"  {'now: ORDER BY ... LIMIT in SQL, through HTTP (ms)':<48} {now_ms:8.1f}  ({before_ms / now_ms:.0f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=None, help="turns per session (default 2, or 1 with --poisoned)")
    parser.add_argument("--poisoned", action="store_true", help="the issue-16 load test with a misbehaving tenant")
    parser.add_argument("--evil", type=int, default=20, help="sessions of the misbehaving tenant (--poisoned)")
    parser.add_argument("--listing", type=int, default=0, help="time paginated listing at this many rows")
    args = parser.parse_args()
    if args.listing:
        asyncio.run(listing(args.listing))
    elif args.poisoned:
        asyncio.run(poisoned(args.sessions, args.evil, args.turns or 1))
    else:
        asyncio.run(main(args.sessions, args.turns or 2))

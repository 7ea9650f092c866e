"""Serving benchmark: 100 concurrent tool-using sessions through the real ``openai`` client on loopback.

Prints, side by side: the policy called directly vs through the server (p50 latency per turn), the p50 server
overhead beyond the policy (auth, routing, exact-token logging; target <= 5 ms), lost or duplicated
interactions in the store (target 0), and raw interactions/s into SQLite (FULL and NORMAL sync).
The policy is a ScriptedPolicy with the SmolLM2 chat format, so the numbers measure taskrl, not a model.

    .venv/bin/python benchmarks/serve_bench.py [--sessions 100] [--turns 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.turns))

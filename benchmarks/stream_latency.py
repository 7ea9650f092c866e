"""Streaming latency (issue 38.4): time to the first content chunk vs the whole response, through the real
``openai`` client against ``create_app`` on loopback, with a tiny random HFPolicy generating many tokens.

Prints the CPU (lscpu's model name), then per run: first-content time, full-response time, content chunks, and
their ratio; then the medians. A replayed stream (the turn sampled whole, then chunked) has a ratio near 1; a
stream sent as it is sampled has a ratio near 1 / tokens.

    .venv/bin/python benchmarks/stream_latency.py [--tokens 200] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.datagen_bench import cpu_model  # noqa: E402
from taskrl.deploy.server import create_app, running_server  # noqa: E402
from taskrl.deploy.store import InteractionStore  # noqa: E402
from taskrl.policies.hf import HFPolicy  # noqa: E402
from taskrl.policies.models import tiny_model  # noqa: E402


def one_run(client: openai.OpenAI, tokens: int, seed: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    first, chunks = None, 0
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "tell me a long story"}], max_tokens=tokens,
        temperature=1.0, seed=seed, stream=True,
    )  # fmt: skip
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            first = first if first is not None else time.perf_counter() - started
    total = time.perf_counter() - started
    return (first if first is not None else total), total, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=200, help="max_tokens per response")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()[0]}; tiny random model, {args.tokens} tokens per response, {args.runs} runs")
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu")
    firsts, totals = [], []
    with tempfile.TemporaryDirectory() as root, InteractionStore(f"sqlite:///{root}/s.db") as store, running_server(
        create_app({"tiny": policy}, store=store)
    ) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        one_run(client, 8, 0)  # warm-up: first forward, vocabulary tables
        for run in range(args.runs):
            first, total, chunks = one_run(client, args.tokens, run + 1)
            firsts.append(first)
            totals.append(total)
            print(f"run {run + 1}: first content {first * 1000:8.1f} ms, full response {total * 1000:8.1f} ms, "
                  f"{chunks} content chunks, ratio {first / total:.3f}")  # fmt: skip
    policy.close()
    first, total = statistics.median(firsts), statistics.median(totals)
    print(f"median: first content {first * 1000:.1f} ms vs full response {total * 1000:.1f} ms "
          f"(first/full = {first / total:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()

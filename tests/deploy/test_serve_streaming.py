"""Issue 38.4: streaming sends tokens as they are sampled, on a real server over a tiny random HFPolicy generating
many tokens: the first content chunk arrives long before the last, the streamed text and tokens equal the same
seeded turn unstreamed, the row is logged with its exact tokens, and a client that leaves mid-stream cancels its
generation (nothing logged as delivered)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.hf import EngineConfig, HFPolicy
from taskrl.policies.models import tiny_model

LONG = {"model": "tiny", "messages": [{"role": "user", "content": "tell me a long story"}], "max_tokens": 160,
        "temperature": 1.0, "seed": 11}  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InteractionStore, HFPolicy]]:
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu",
                      engine_config=EngineConfig(draft_tokens=0))  # one token per step: a steady stream
    path = tmp_path_factory.mktemp("stream") / "s.db"
    with InteractionStore(f"sqlite:///{path}", sqlite_synchronous="NORMAL") as store:
        try:
            with running_server(create_app({"tiny": policy}, store=store)) as url:
                yield url, store, policy
        finally:
            policy.close()


def test_the_first_chunk_arrives_long_before_the_last(served: tuple) -> None:
    url, store, _ = served
    whole = httpx.post(url + "/chat/completions", json={**LONG, "return_token_ids": True}, timeout=300).json()
    started = time.perf_counter()
    arrivals: list[tuple[float, dict]] = []
    with httpx.stream("POST", url + "/chat/completions", json={**LONG, "stream": True}, timeout=300) as response:
        assert response.status_code == 200 and response.headers["x-interaction-id"].startswith("chatcmpl-")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                arrivals.append((time.perf_counter() - started, json.loads(line[6:])))
    content = [(at, c) for at, c in arrivals if c["choices"] and c["choices"][0]["delta"].get("content")]
    total = arrivals[-1][0]
    assert len(content) >= 20, "the content came in a few pieces, not as it was sampled"
    assert content[0][0] < 0.25 * total, f"first content at {content[0][0]:.2f}s of {total:.2f}s"
    text = "".join(c["choices"][0]["delta"]["content"] for _, c in content)
    assert text == whole["choices"][0]["message"]["content"]  # same seed, same turn, streamed or not
    assert whole["usage"]["completion_tokens"] >= 100
    row = store.get_interaction(arrivals[0][1]["id"], tenant="default")
    assert row is not None and row.delivered
    assert row.completion_token_ids == whole["choices"][0]["token_ids"]


def test_a_client_leaving_mid_stream_cancels_its_generation(served: tuple) -> None:
    url, store, policy = served
    cancelled = policy.engine_stats()["cancelled"]
    body = {**LONG, "max_tokens": 1500, "stream": True, "seed": 12}
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=300) as response:
        interaction_id = response.headers["x-interaction-id"]
        for line in response.iter_lines():
            if '"content"' in line and '"content": ""' not in line:
                break  # the first real content: hang up
    deadline = time.monotonic() + 60
    while policy.engine_stats()["cancelled"] == cancelled and time.monotonic() < deadline:
        time.sleep(0.1)
    assert policy.engine_stats()["cancelled"] == cancelled + 1  # its row left the batch: nothing decodes for nobody
    assert store.get_interaction(interaction_id, tenant="default") is None  # never finished, never logged

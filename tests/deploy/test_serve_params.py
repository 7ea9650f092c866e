"""Issue 38.11: request parameters a vLLM user expects, through the official OpenAI SDK against a real server over a
tiny random HFPolicy: ``min_p`` honoured, unknown fields refused naming them (vLLM's own extensions honoured or
refused), logprobs in a stream, ``/v1/completions`` (text and token-id prompts) and ``/v1/models/{id}``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.base import InvalidRequestError, SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.policies.sampling import Request, sample_row

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InteractionStore, HFPolicy]]:
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu")
    path = tmp_path_factory.mktemp("params") / "s.db"
    with InteractionStore(f"sqlite:///{path}", sqlite_synchronous="NORMAL") as store:
        try:
            with running_server(create_app({"tiny": policy}, store=store)) as url:
                yield url, store, policy
        finally:
            policy.close()


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)


def test_min_p_keeps_only_tokens_near_the_most_likely() -> None:
    logp = torch.log_softmax(torch.tensor([2.0, 1.9, 0.0, -1.0, 1.5]), dim=-1)
    seen = set()
    for seed in range(200):
        request = Request([1], SamplingParams(min_p=0.6), seed, 1, None, None)  # type: ignore[arg-type]
        request.generator = torch.Generator().manual_seed(seed)
        seen.add(int(sample_row(logp, request)))
    assert seen == {0, 1, 4}  # p >= 0.6 * p_max: exp(1.5 - 2) = 0.61 stays, exp(-2) does not
    with pytest.raises(InvalidRequestError, match="min_p"):
        SamplingParams(min_p=1.5)


def test_min_p_one_samples_the_greedy_tokens(served: tuple) -> None:
    url, _, _ = served
    client = sdk(url)
    greedy = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0,
                                            extra_body={"return_token_ids": True})  # fmt: skip
    for seed in (1, 2):  # at temperature 1.5 a random model's samples differ from greedy unless min_p prunes them
        extra = {"min_p": 1.0, "return_token_ids": True}
        sampled = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=1.5,
                                                 seed=seed, extra_body=extra)  # fmt: skip
        assert sampled.choices[0].model_extra["token_ids"] == greedy.choices[0].model_extra["token_ids"]
    free = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=1.5, seed=1,
                                          extra_body={"return_token_ids": True})  # fmt: skip
    assert free.choices[0].model_extra["token_ids"] != greedy.choices[0].model_extra["token_ids"]


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [("max_token", 5, "unknown_parameter"), ("foo", {"a": 1}, "unknown_parameter"),
     ("ignore_eos", True, "unsupported_parameter"), ("use_beam_search", True, "unsupported_parameter"),
     ("stop_token_ids", [2], "unsupported_parameter"), ("min_tokens", 3, "unsupported_parameter"),
     ("guided_json", {"type": "object"}, "unknown_parameter"), ("n", 2, None)],
)  # fmt: skip
def test_unknown_and_unhonoured_fields_are_refused_naming_them(served: tuple, field: str, value: Any,
                                                                code: str | None) -> None:  # fmt: skip
    url, _, _ = served
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(url).chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, extra_body={field: value})
    assert refused.value.param == field and field in refused.value.message
    if code is not None:
        assert refused.value.code == code


def test_vllm_fields_at_their_neutral_values_pass(served: tuple) -> None:
    url, _, _ = served
    neutral = {"ignore_eos": False, "skip_special_tokens": True, "min_tokens": 0, "stop_token_ids": [],
               "echo": False, "top_k": -1, "min_p": 0.0, "request_id": None}  # fmt: skip
    reply = sdk(url).chat.completions.create(model="tiny", messages=HELLO, max_tokens=2, extra_body=neutral)
    assert reply.usage is not None and reply.usage.completion_tokens >= 1


def test_a_stream_carries_the_logprobs_of_every_token(served: tuple) -> None:
    url, _, _ = served
    client = sdk(url)
    asked = {"model": "tiny", "messages": HELLO, "max_tokens": 20, "temperature": 1.0, "seed": 7, "logprobs": True}
    whole = client.chat.completions.create(**asked, extra_body={"return_token_ids": True})
    chunks = list(client.chat.completions.create(**asked, stream=True))
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert whole.choices[0].logprobs is not None
    # the same tokens (same seed); their logprobs to float noise: the second request may reuse the first's prompt
    # KV from the prefix cache, computed in another batch shape (1e-6 apart under a loaded two-worker run)
    assert [e.token for e in streamed] == [e.token for e in whole.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in whole.choices[0].logprobs.content],
                                                         abs=1e-4)  # fmt: skip
    assert len(streamed) == len(whole.choices[0].model_extra["token_ids"])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert any(c.choices[0].delta.content and c.choices[0].logprobs for c in chunks if c.choices)  # content has them


def test_completions_from_text_and_from_token_ids(served: tuple) -> None:
    url, store, policy = served
    client = sdk(url)
    prompt_ids = policy.chat_format.encode("The capital of France is")
    by_text = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=6, temperature=0,
                                        logprobs=0, extra_body={"return_token_ids": True})  # fmt: skip
    by_ids = client.completions.create(model="tiny", prompt=prompt_ids, max_tokens=6, temperature=0,
                                       extra_body={"return_token_ids": True})  # fmt: skip
    assert by_text.object == "text_completion" and by_text.model_extra["prompt_token_ids"] == prompt_ids
    assert by_ids.choices[0].text == by_text.choices[0].text
    ids = by_text.choices[0].model_extra["token_ids"]
    assert by_text.usage is not None and by_text.usage.completion_tokens == len(ids)
    assert by_text.choices[0].logprobs is not None and len(by_text.choices[0].logprobs.token_logprobs or []) == len(ids)
    row = store.get_interaction(by_ids.id, tenant="default")
    assert row is not None and row.prompt_token_ids == prompt_ids and row.completion_token_ids == ids
    streamed = client.completions.create(model="tiny", prompt=prompt_ids, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == by_ids.choices[0].text
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=[10**9], max_tokens=2)
    assert refused.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"bogus": 1})
    assert refused.value.param == "bogus"


def test_models_can_be_retrieved_by_id(served: tuple) -> None:
    url, _, _ = served
    client = sdk(url)
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    missing = httpx.get(url + "/models/nope", timeout=10)
    assert missing.json()["error"]["code"] == "model_not_found"


def test_a_completions_row_trains_like_a_chat_row(served: tuple, tmp_path: Path) -> None:
    url, store, _ = served
    reply = httpx.post(url + "/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3}, timeout=60)
    assert reply.status_code == 200, reply.text
    row = store.get_interaction(reply.json()["id"], tenant="default")
    assert row is not None and row.response["message"]["content"] == reply.json()["choices"][0]["text"]
    assert json.dumps(row.request)  # stored as received

"""Issue 38.3: forced and named tool choice through the official OpenAI SDK, honoured by constrained decoding on a
tiny random model (its own output is garbage, so the grammar does all the work): never a 500, always one valid call
to an allowed function; ``none`` emits no call; a budget too small for any call is a 400 naming ``max_tokens``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ASK = {"model": "tiny", "messages": [{"role": "user", "content": "weather in Paris?"}], "tools": [WEATHER, TIME]}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openai.OpenAI, InteractionStore, HFPolicy]]:
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, device="cpu")
    path = tmp_path_factory.mktemp("choice") / "s.db"
    with InteractionStore(f"sqlite:///{path}", sqlite_synchronous="NORMAL") as store:
        try:
            with running_server(create_app({"tiny": policy}, store=store)) as url:
                yield openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120), store, policy
        finally:
            policy.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_makes_one_valid_call_to_a_request_tool(served: tuple, seed: int) -> None:
    client, store, policy = served
    reply = client.chat.completions.create(**ASK, tool_choice="required", max_tokens=48, seed=seed, temperature=1.2)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in ("get_weather", "get_time")
        assert isinstance(json.loads(call.function.arguments), dict)
    row = store.get_interaction(reply.id, tenant="default")
    assert row is not None and "<tool_call>" in policy.chat_format.decode(row.completion_token_ids)  # sampled
    assert policy.chat_format.decode(row.prompt_token_ids).endswith("assistant\n")  # nothing forced into the prompt


@pytest.mark.parametrize("name", ["get_time", "get_weather"])
def test_a_named_function_is_the_one_called(served: tuple, name: str) -> None:
    client, _, _ = served
    for seed in (3, 4):
        reply = client.chat.completions.create(**ASK, tool_choice={"type": "function", "function": {"name": name}},
                                               max_tokens=48, seed=seed)  # fmt: skip
        calls = reply.choices[0].message.tool_calls
        assert calls is not None and [c.function.name for c in calls] == [name]


def test_required_without_parallel_calls_is_exactly_one_call_also_streamed(served: tuple) -> None:
    client, _, _ = served
    reply = client.chat.completions.create(**ASK, tool_choice="required", parallel_tool_calls=False, max_tokens=48,
                                           seed=5)  # fmt: skip
    assert len(reply.choices[0].message.tool_calls or []) == 1
    chunks = list(client.chat.completions.create(**ASK, tool_choice="required", parallel_tool_calls=False,
                                                 max_tokens=48, seed=5, stream=True))  # fmt: skip
    streamed = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in streamed] == [reply.choices[0].message.tool_calls[0].function.name]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # no call text as content


def test_none_emits_no_call_and_a_budget_too_small_is_a_400(served: tuple) -> None:
    client, _, _ = served
    for seed in range(3):
        reply = client.chat.completions.create(**ASK, tool_choice="none", max_tokens=24, seed=seed)
        assert not reply.choices[0].message.tool_calls and reply.choices[0].finish_reason != "tool_calls"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**ASK, tool_choice="required", max_tokens=5)
    assert refused.value.param == "max_tokens" and "forced tool call" in refused.value.message

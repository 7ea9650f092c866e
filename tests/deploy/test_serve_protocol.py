"""Issue 16, Medium: OpenAI's protocol where taskrl used to differ (context overflow, stop strings, unsupported
parameters, tool_choice, error shapes), through the real openai client against a real server on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from taskrl.chat import ChatFormat
from taskrl.deploy.config import ServeConfig
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.base import Completion, SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import smollm2_tokenizer, tiny_model
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.types import Message

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def agent_rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    last = messages[-1].content
    if tools and "two" in last:
        return ScriptedPolicy.call("get_weather", city="Rome") + "\n" + ScriptedPolicy.call("get_time")
    if tools and "nest" in last:  # a model emitting absurdly nested arguments
        deep = "[" * 300 + "]" * 300
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": ' + deep + "}}\n</tool_call>"
    if tools:
        return ScriptedPolicy.call("get_weather", city="Oslo")
    return "plain answer"


class Recording(ScriptedPolicy):
    """ScriptedPolicy that records the sampling parameters it was asked for."""

    seen: list[SamplingParams]

    async def generate(self, **kwargs: Any) -> Completion:
        self.seen.append(kwargs["sampling"])
        return await super().generate(**kwargs)


class Exploding(ScriptedPolicy):
    async def generate(self, **kwargs: Any) -> Completion:
        raise RuntimeError("a bug, not a PolicyError")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InteractionStore, dict[str, Any]]]:
    chat_format = ChatFormat(smollm2_tokenizer())
    model, tokenizer = tiny_model(seed=0)
    scripted = Recording(agent_rule, name="agent", chat_format=chat_format)
    scripted.seen = []
    policies = {
        "agent": scripted,
        "tiny": HFPolicy(model, tokenizer, device="cpu"),
        "exploding": Exploding(agent_rule, chat_format=chat_format),
        "message-mode": ScriptedPolicy(agent_rule),
    }
    path = tmp_path_factory.mktemp("protocol") / "s.db"
    with InteractionStore(f"sqlite:///{path}", sqlite_synchronous="NORMAL") as store:
        app = create_app(policies, store=store, config=ServeConfig(max_body_bytes=64 * 1024))
        with running_server(app) as url:
            yield url, store, policies


def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=2, timeout=60)


def ask(url: str, text: str = "hi", **fields: Any) -> Any:
    model = fields.pop("model", "agent")
    return oa(url).chat.completions.create(model=model, messages=[{"role": "user", "content": text}], **fields)


def test_context_overflow_is_400_context_length_exceeded(server: tuple) -> None:
    url, _, _ = server
    for fields in ({"text": "word " * 3000}, {"text": "hi", "max_tokens": 2040}):
        with pytest.raises(openai.BadRequestError) as refused:
            ask(url, model="tiny", **fields)
        assert refused.value.code == "context_length_exceeded" and refused.value.param == "messages"
        assert "maximum context length is 2048 tokens" in refused.value.message
    assert ask(url, "hi", model="tiny", max_tokens=3).choices[0].finish_reason in ("stop", "length")


def test_stop_strings_are_trimmed_from_text_but_stored_tokens_stay_exact(server: tuple) -> None:
    url, store, policies = server
    fields = {
        "model": "tiny",
        "seed": 7,
        "temperature": 1.0,
        "max_tokens": 24,
        "extra_body": {"return_token_ids": True},
    }
    free = ask(url, "tell me", **fields)
    text = free.choices[0].message.content
    starts = [i for i in range(2, len(text) - 2) if text[i : i + 2].strip() and "\ufffd" not in text[: i + 2]]
    assert starts, text
    stop = text[starts[len(starts) // 2] : starts[len(starts) // 2] + 2]
    stopped = ask(url, "tell me", stop=[stop], **fields)
    content = stopped.choices[0].message.content
    assert content == text[: text.find(stop)] and stop not in content
    assert stopped.choices[0].finish_reason == "stop"
    row = store.interactions(ids=[stopped.id])[0]
    free_ids = free.choices[0].model_extra["token_ids"]
    assert row.completion_token_ids == free_ids[: len(row.completion_token_ids)]  # the sampled prefix, exactly
    decoded = policies["tiny"].chat_format.decode(row.completion_token_ids)
    assert stop in decoded and row.response["message"]["content"] == content


def test_forcing_needs_a_constraining_backend_and_tool_choice_none(server: tuple) -> None:
    url, _, _ = server
    client = oa(url)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for model, choice in (("agent", named), ("agent", "required"), ("message-mode", "required")):
        with pytest.raises(openai.BadRequestError) as refused:  # rules cannot be constrained: say so, never a 500
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "continue"}],
                                           tools=[WEATHER, TIME], tool_choice=choice)  # fmt: skip
        assert refused.value.param == "tool_choice"
    none = client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER], tool_choice="none"
    )
    assert none.choices[0].message.content == "plain answer" and not none.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "rm_rf"}})  # fmt: skip
    assert refused.value.param == "tool_choice"


def test_parallel_tool_calls_false_ends_the_turn_at_the_first_call(server: tuple) -> None:
    url, _, policies = server
    client = oa(url)
    both = client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "two"}],
                                          tools=[WEATHER, TIME])  # fmt: skip
    assert len(both.choices[0].message.tool_calls) == 2
    policies["agent"].seen.clear()
    client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "two"}],
                                   tools=[WEATHER, TIME], parallel_tool_calls=False)  # fmt: skip
    assert "</tool_call>" in policies["agent"].seen[-1].stop  # the engine stops after the first call


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_logprobs", 3), ("presence_penalty", 0.5), ("frequency_penalty", -1.0), ("logit_bias", {"42": 5}),
        ("response_format", {"type": "json_object"}), ("functions", [{"name": "f"}]), ("repetition_penalty", 1.2),
    ],
)  # fmt: skip
def test_unsupported_parameters_are_refused_naming_the_field(server: tuple, field: str, value: Any) -> None:
    url, _, _ = server
    with pytest.raises(openai.BadRequestError) as refused:
        ask(url, extra_body={field: value})
    assert refused.value.param == field and field in refused.value.message


def test_neutral_values_of_unsupported_parameters_are_accepted(server: tuple) -> None:
    url, _, _ = server
    neutral = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}, "response_format": {"type": "text"}}
    assert ask(url, extra_body={**neutral, "top_logprobs": 0}).choices[0].message.content == "plain answer"


def test_every_error_is_openai_shaped_json(server: tuple) -> None:
    url, _, _ = server
    root = url.removesuffix("/v1")
    exploding = {"model": "exploding", "messages": [{"role": "user", "content": "x"}]}
    with httpx.Client(timeout=30) as http:
        cases = [
            http.post(url + "/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}),
            http.get(url + "/no-such-route"),
            http.get(url + "/chat/completions"),
            http.post(url + "/chat/completions", content=b"x" * 70_000, headers={"Content-Type": "application/json"}),
            http.post(url + "/chat/completions", json=exploding),
        ]  # fmt: skip
        statuses = [r.status_code for r in cases]
        assert statuses == [400, 404, 405, 413, 500], [r.text for r in cases]
        for response in cases:
            assert response.headers["content-type"].startswith("application/json"), response.text
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert cases[3].json()["error"]["code"] == "request_too_large"
        # the connection survives an unhandled error: the next request on the same client is answered
        again = http.post(
            url + "/chat/completions", json={"model": "agent", "messages": [{"role": "user", "content": "x"}]}
        )
        assert again.status_code == 200
    assert httpx.get(root + "/ready").json()["status"] == "ready"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_json_is_a_400_naming_the_field(server: tuple) -> None:
    """Issue 18: arguments nested 5,000 deep raised RecursionError (500); 300 deep failed pydantic's dump (500)."""
    url, store, _ = server
    before = store.count()
    history = [{"role": "user", "content": "hi"}]
    for arguments in ('{"a": ' + nested(5000) + "}", '{"a": ' + nested(40) + "}"):
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        turns = [*history, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1",
                                                                            "content": "x"}]  # fmt: skip
        with pytest.raises(openai.BadRequestError) as refused:
            oa(url).chat.completions.create(model="agent", messages=turns)
        assert refused.value.param == "messages.1.tool_calls.0.function.arguments"
        assert "nested deeper than 32 levels" in refused.value.message
    deep_tool = {"type": "function", "function": {"name": "f", "parameters": json.loads('{"a": ' + nested(300) + "}")}}
    with pytest.raises(openai.BadRequestError) as refused:
        oa(url).chat.completions.create(model="agent", messages=history, tools=[deep_tool])
    assert refused.value.param == "tools" and "nested deeper than 64 levels" in refused.value.message
    body = '{"model": "agent", "messages": [{"role": "user", "content": "hi"}], "tools": ' + nested(5000) + "}"
    raw = httpx.post(url + "/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"
    assert store.count() == before  # nothing refused was logged
    reply = oa(url).chat.completions.create(model="agent", messages=[{"role": "user", "content": "nest"}],
                                            tools=[WEATHER])  # fmt: skip
    row = store.interactions(ids=[reply.id])[0]  # a model's own over-deep call is served and stored, not a crash
    assert reply.choices[0].finish_reason in ("stop", "tool_calls") and row.response["message"]
    assert ask(url).choices[0].message.content == "plain answer"


def test_ids_are_128_bit(server: tuple, tmp_path: Path) -> None:
    url, _, _ = server
    reply = ask(url)
    assert reply.id.startswith("chatcmpl-") and len(reply.id.removeprefix("chatcmpl-")) == 32

"""The OpenAI-compatible server, started for real on loopback, over a policy that returns fixed completions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import fastapi
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskrl.chat import format_tool_call
from taskrl.deploy.server import _parse_hermes_tool_calls, create_app, running_server
from taskrl.policies.base import Completion, Policy, PolicyError, SamplingParams
from taskrl.types import Message


class FixedPolicy:
    """Message-mode policy that answers every request with ``completion`` and records what it was asked."""

    def __init__(self, completion: Completion | None = None, error: str | None = None) -> None:
        self.name = "fixed"
        self.version = 3
        self.chat_format = None
        self.completion = completion or Completion(text="hello")
        self.error = error
        self.calls: list[dict[str, Any]] = []

    async def generate(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> Completion:
        self.calls.append({"messages": messages, "tools": tools, "sampling": sampling})
        if self.error:
            raise PolicyError(self.error)
        return self.completion


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def policies() -> dict[str, FixedPolicy]:
    return {"fixed": FixedPolicy(), "broken": FixedPolicy(error="model exploded")}


@pytest.fixture(scope="module")
def client(policies: dict[str, FixedPolicy]) -> Iterator[httpx.Client]:
    with running_server(create_app(policies)) as base_url, httpx.Client(base_url=base_url, timeout=10) as c:
        yield c


def chat(client: httpx.Client, **fields: Any) -> httpx.Response:
    body = {"model": "fixed", "messages": [{"role": "user", "content": "hi"}], **fields}
    return client.post("/chat/completions", json=body)


def test_fixed_policy_satisfies_the_protocol() -> None:
    assert isinstance(FixedPolicy(), Policy)


def test_health_and_models(client: httpx.Client) -> None:
    root = str(client.base_url).removesuffix("/v1/").removesuffix("/v1")
    health = httpx.get(root + "/health", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    models = client.get("/models")
    assert models.status_code == 200
    data = models.json()["data"]
    assert {m["id"] for m in data} == {"fixed", "broken"}
    assert all(m["object"] == "model" for m in data)


@pytest.mark.parametrize(
    "fields, where",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "tool_call_id"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{oops"}}],
                    },
                ]
            },
            "arguments",
        ),
    ],
)
def test_bad_request_is_400_with_openai_error(client: httpx.Client, fields: dict, where: str) -> None:
    response = chat(client, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and where in error["message"]


def test_missing_model_field_is_400(client: httpx.Client) -> None:
    response = client.post("/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 400


def test_unknown_model_is_404_naming_served_models(client: httpx.Client) -> None:
    response = chat(client, model="gpt-9")
    assert response.status_code == 404
    assert "fixed" in response.json()["error"]["message"]


def test_stream_is_server_sent_events(client: httpx.Client, policies: dict) -> None:
    policies["fixed"].completion = Completion(text="a streamed answer that spans pieces")
    response = chat(client, stream=True)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "a streamed answer that spans pieces"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_policy_error_is_500_with_its_message(client: httpx.Client) -> None:
    response = chat(client, model="broken")
    assert response.status_code == 500
    assert "model exploded" in response.json()["error"]["message"]


def test_plain_completion_and_request_mapping(client: httpx.Client, policies: dict) -> None:
    policy = policies["fixed"]
    policy.completion = Completion(text="hello", token_ids=[5, 6], logprobs=[-0.5, -0.25], prompt_token_ids=[1, 2, 3])
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "hi"},
    ]
    response = chat(
        client,
        messages=messages,
        tools=[WEATHER_TOOL],
        max_tokens=7,
        stop="END",
        seed=11,
        temperature=0.0,
        logprobs=True,
        return_token_ids=True,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "hello"}
    assert choice["finish_reason"] == "stop"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.5, -0.25]
    assert choice["token_ids"] == [5, 6] and body["prompt_token_ids"] == [1, 2, 3]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}

    call = policy.calls[-1]
    assert call["messages"][0] == Message("system", "be brief")
    assert call["tools"] == [WEATHER_TOOL]
    sampling = call["sampling"]
    assert (sampling.max_new_tokens, sampling.stop, sampling.seed, sampling.temperature) == (7, ["END"], 11, 0.0)


def test_token_fields_only_when_asked(client: httpx.Client, policies: dict) -> None:
    policies["fixed"].completion = Completion(text="hi", token_ids=[5], logprobs=[-1.0])
    choice = chat(client).json()["choices"][0]
    assert choice["logprobs"] is None and "token_ids" not in choice


def test_hermes_tool_calls_become_openai_tool_calls(client: httpx.Client, policies: dict) -> None:
    text = (
        "Let me check.\n"
        + format_tool_call("get_weather", {"city": "Paris"})
        + "\n"
        + format_tool_call("get_weather", {"city": "Oslo"})
    )
    policies["fixed"].completion = Completion(text=text)
    choice = chat(client, tools=[WEATHER_TOOL]).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me check."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert len({c["id"] for c in calls}) == 2 and all(c["type"] == "function" for c in calls)


def test_unparseable_block_stays_in_content(client: httpx.Client, policies: dict) -> None:
    text = "<tool_call>\n{not json}\n</tool_call>"
    policies["fixed"].completion = Completion(text=text)
    choice = chat(client).json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": text}


def test_length_finish_wins_over_tool_calls(client: httpx.Client, policies: dict) -> None:
    policies["fixed"].completion = Completion(text=format_tool_call("f", {}), finish_reason="length")
    choice = chat(client).json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["message"]["tool_calls"]) == 1


def test_create_app_needs_a_policy() -> None:
    with pytest.raises(ValueError, match="at least one policy"):
        create_app({})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(
    prefix=st.text(max_size=20).filter(lambda s: "<tool_call>" not in s),
    name=st.text(min_size=1, max_size=10),
    arguments=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
)
def test_parser_recovers_any_formatted_call(prefix: str, name: str, arguments: dict) -> None:
    content, calls = _parse_hermes_tool_calls(prefix + format_tool_call(name, arguments))
    assert [(c.name, c.arguments) for c in calls] == [(name, arguments)]
    assert content == prefix.strip()


def test_parser_keeps_plain_text_exactly() -> None:
    assert _parse_hermes_tool_calls("  hi there \n") == ("  hi there \n", [])


def test_running_server_needs_a_health_route_and_stops_cleanly() -> None:
    with pytest.raises(RuntimeError, match="no /health route"), running_server(fastapi.FastAPI()):
        pass
    with running_server(create_app({"fixed": FixedPolicy()})) as base_url:
        assert httpx.get(base_url + "/models", timeout=5).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(base_url + "/models", timeout=5)

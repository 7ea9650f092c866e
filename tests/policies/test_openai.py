"""OpenAIPolicy end to end against taskrl's own server (HFPolicy over a tiny model) on loopback.

Error paths a real server does not produce on demand (malformed tool-call arguments, transient 5xx)
use a small fake upstream app, also served for real on loopback.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import time
from collections.abc import Iterator
from typing import Any

import fastapi
import pytest
from fastapi.responses import JSONResponse

from taskrl.deploy.server import create_app, running_server
from taskrl.policies.base import Policy, PolicyError, SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.policies.openai import OpenAIPolicy
from taskrl.types import Message

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
MESSAGES = [Message("system", "You are terse."), Message("user", "What is the weather in Paris?")]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


# -- against the real server ------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def served_url(tiny: tuple[Any, Any]) -> Iterator[str]:
    # The served HFPolicy lives on the server thread's event loop; tests build their own for direct calls.
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, device="cpu")
    try:
        with running_server(create_app({"tiny": policy})) as base_url:
            yield base_url
    finally:
        policy.close()


def test_openai_policy_satisfies_the_protocol() -> None:
    policy = OpenAIPolicy("http://127.0.0.1:1/v1", "m")
    assert isinstance(policy, Policy) and policy.chat_format is None


async def test_greedy_matches_hf_policy_token_for_token(tiny: tuple[Any, Any], served_url: str) -> None:
    model, tokenizer = tiny
    direct_policy = HFPolicy(model, tokenizer, device="cpu")
    prompt_ids = direct_policy.chat_format.prompt_ids(MESSAGES, [WEATHER_TOOL])
    direct = await direct_policy.generate(token_ids=prompt_ids, sampling=GREEDY)
    direct_policy.close()

    async with OpenAIPolicy(served_url, "tiny", timeout_s=60) as remote:
        served = await remote.generate(messages=MESSAGES, tools=[WEATHER_TOOL], sampling=GREEDY)

    assert served.token_ids == direct.token_ids and len(served.token_ids) > 0
    assert served.logprobs == pytest.approx(direct.logprobs, abs=1e-4)
    assert len(served.logprobs) == len(served.token_ids)
    assert (served.text, served.finish_reason) == (direct.text, direct.finish_reason)
    # The tool schemas reached the chat template: the server conditioned on exactly our rendering.
    assert served.prompt_token_ids == prompt_ids
    assert len(served.prompt_token_ids) > len(direct_policy.chat_format.prompt_ids(MESSAGES, None))
    assert served.policy_version == 0 and served.info == {}


def test_one_policy_serves_successive_event_loops(served_url: str) -> None:
    # Each asyncio.run has its own loop; an HTTP pool left from a closed loop failed every later request
    # with "Event loop is closed" (issue 36).
    policy = OpenAIPolicy(served_url, "tiny", timeout_s=60)

    async def one_turn() -> list[int]:
        return (await policy.generate(messages=MESSAGES, sampling=GREEDY)).token_ids

    first = asyncio.run(one_turn())
    second = asyncio.run(one_turn())
    assert first == second and len(first) > 0

    async def close_and_reuse() -> list[int]:
        await policy.aclose()
        return await one_turn()

    assert asyncio.run(close_and_reuse()) == first
    assert len(pickle.loads(pickle.dumps(policy))._clients) == 0  # copies open their own clients


async def test_4xx_raises_policy_error_with_server_message(served_url: str) -> None:
    async with OpenAIPolicy(served_url, "no-such-model", timeout_s=10) as remote:
        with pytest.raises(PolicyError, match=r"HTTP 404.*'no-such-model' is not served here"):
            await remote.generate(messages=MESSAGES, sampling=GREEDY)


async def test_token_mode_call_is_refused() -> None:
    with pytest.raises(PolicyError, match="works on messages"):
        await OpenAIPolicy("http://127.0.0.1:1/v1", "m").generate(token_ids=[1, 2], sampling=GREEDY)


async def test_unreachable_endpoint_fails_fast_naming_the_url() -> None:
    with socket.socket() as sock:  # a port nobody listens on once this socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    policy = OpenAIPolicy(url, "m", timeout_s=2, max_retries=2, retry_backoff_s=0.01)
    start = time.monotonic()
    with pytest.raises(PolicyError) as info:
        await policy.generate(messages=MESSAGES, sampling=GREEDY)
    assert time.monotonic() - start < 2
    message = str(info.value)
    assert f"{url}/chat/completions" in message and "start the server or pass the right --base-url" in message
    assert "\n" not in message
    await policy.aclose()


# -- against a fake upstream, for responses a real server will not produce on demand ----------
def _fake_upstream() -> fastapi.FastAPI:
    app = fastapi.FastAPI()
    app.state.requests = []
    app.state.failures_left = 0

    @app.post("/v1/chat/completions")
    async def chat(request: fastapi.Request) -> Any:
        app.state.requests.append({"body": await request.json(), "headers": dict(request.headers)})
        if app.state.failures_left:
            app.state.failures_left -= 1
            return JSONResponse(status_code=503, content={"error": {"message": "warming up"}})
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{city:"}}
        good = {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
        return {
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call, good]},
                    "finish_reason": "tool_calls",
                }
            ]
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/load_lora_adapter")
    async def load(request: fastapi.Request) -> Any:
        app.state.requests.append({"body": await request.json(), "headers": dict(request.headers)})
        return "Success: LoRA adapter loaded"

    return app


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, fastapi.FastAPI]]:
    app = _fake_upstream()
    with running_server(app) as base_url:
        yield base_url, app


async def test_malformed_tool_arguments_are_reported_not_raised(upstream: tuple[str, Any]) -> None:
    base_url, app = upstream
    async with OpenAIPolicy(base_url, "m", api_key="sk-test", timeout_s=10) as remote:
        completion = await remote.generate(messages=MESSAGES, tools=[WEATHER_TOOL], sampling=GREEDY)
    assert completion.text == "" and completion.finish_reason == "stop"
    assert [(c.id, c.arguments) for c in completion.tool_calls] == [
        ("call_1", {"__raw__": "{city:"}),
        ("call_2", {}),
    ]
    [invalid] = completion.info["invalid_tool_call_arguments"]
    assert invalid["call_id"] == "call_1" and invalid["arguments"] == "{city:"
    assert completion.token_ids == [] and completion.logprobs == [] and completion.prompt_token_ids is None

    sent = app.state.requests[-1]
    assert sent["headers"]["authorization"] == "Bearer sk-test"
    body = sent["body"]
    assert body["tools"] == [WEATHER_TOOL] and body["logprobs"] is True and body["return_token_ids"] is True
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("m", 12, 0.0)
    assert "stop" not in body and "seed" not in body and "top_k" not in body


async def test_5xx_is_retried_then_reported(upstream: tuple[str, Any]) -> None:
    base_url, app = upstream
    async with OpenAIPolicy(base_url, "m", timeout_s=10, max_retries=2, retry_backoff_s=0.01) as remote:
        app.state.failures_left = 2
        completion = await remote.generate(messages=MESSAGES, sampling=GREEDY)
        assert len(completion.tool_calls) == 2
        app.state.failures_left = 3
        with pytest.raises(PolicyError, match="HTTP 503: warming up"):
            await remote.generate(messages=MESSAGES, sampling=GREEDY)
    app.state.failures_left = 0


async def test_lora_load_bumps_version_and_switches_model(upstream: tuple[str, Any]) -> None:
    base_url, app = upstream
    async with OpenAIPolicy(base_url, "base", timeout_s=10) as remote:
        assert await remote.load_lora_adapter("step-7", "/ckpt/step-7") == 1
        assert app.state.requests[-1]["body"] == {"lora_name": "step-7", "lora_path": "/ckpt/step-7"}
        completion = await remote.generate(messages=MESSAGES, sampling=GREEDY)
        assert completion.policy_version == 1 and app.state.requests[-1]["body"]["model"] == "step-7"
        remote.set_version(5)
        assert (await remote.generate(messages=MESSAGES, sampling=GREEDY)).policy_version == 5

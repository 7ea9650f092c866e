"""The deploy server end to end on loopback, spoken to only with the ``openai`` client and plain HTTP.

Policies are ScriptedPolicy rules with the SmolLM2 tokenizer's chat format, so every turn has exact token
ids and the store can be checked token for token; the store is a real SQLite file in a temp dir.
"""

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
from taskrl.deploy.router import RouterConfig
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.types import Message

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
ADMIN = "admin-key"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
DELETE_TOOL = {
    "type": "function",
    "function": {"name": "delete_repo", "description": "Delete everything.", "parameters": {"type": "object"}},
}


def weather_rule(answer: str) -> Any:
    def rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        last = messages[-1]
        if last.role == "tool":
            return f"{answer} {last.content}"
        if tools and "delete" in last.content:
            return ScriptedPolicy.call("delete_repo")
        if tools and "weather" in last.content:
            return ScriptedPolicy.call("get_weather", city="Paris")
        return answer

    return rule


@pytest.fixture(scope="module")
def chat_format() -> ChatFormat:
    return ChatFormat(smollm2_tokenizer())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[InteractionStore]:
    # NORMAL: these tests are not about power loss, and one fsync per sequential request would dominate.
    with InteractionStore(f"sqlite:///{tmp_path / 'interactions.db'}", sqlite_synchronous="NORMAL") as s:
        yield s


def make_server(store: InteractionStore, chat_format: ChatFormat, **config: Any) -> Any:
    policy = ScriptedPolicy(weather_rule("Sunny:"), name="v0", chat_format=chat_format)
    # No holdout unless a test asks: the default 5% share with a random per-deployment salt labels one session
    # in twenty route="holdout" (on the same v0), which failed the exact route checks one run in twenty.
    config.setdefault("router", RouterConfig(holdout=0.0))
    config = ServeConfig(api_keys=KEYS, admin_keys=(ADMIN,), **config)
    return create_app({"agent": policy}, store=store, config=config)


def client(base_url: str, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)


def say(oa: openai.OpenAI, session: str, text: str = "hi") -> Any:
    """One chat turn of ``session`` (sessions travel in the X-Session-Id header)."""
    return oa.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": text}], extra_headers={"x-session-id": session}
    )


def test_chat_with_tools_logs_exact_tokens(store: InteractionStore, chat_format: ChatFormat) -> None:
    with running_server(make_server(store, chat_format)) as base_url:
        oa = openai.OpenAI(
            base_url=base_url, api_key="key-a", default_headers={"x-session-id": "s1"}, max_retries=0, timeout=30
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
        first = oa.chat.completions.create(model="agent", messages=messages, tools=[WEATHER_TOOL])
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "18C"}]
        second = oa.chat.completions.create(model="agent", messages=messages, tools=[WEATHER_TOOL])
        assert second.choices[0].message.content == "Sunny: 18C"

    rows = store.interactions()
    assert [r.id for r in rows] == [first.id, second.id]
    assert {(r.tenant, r.session_id, r.policy_version, r.route, r.shadow) for r in rows} == {
        ("tenant-a", "s1", 0, "stable", False)
    }
    prompt = chat_format.prompt_ids([Message("user", "weather in Paris?")], [WEATHER_TOOL])
    assert rows[0].prompt_token_ids == prompt
    expected = chat_format.encode(ScriptedPolicy.call("get_weather", city="Paris"))
    assert rows[0].completion_token_ids[: len(expected)] == expected
    assert len(rows[0].logprobs) == len(rows[0].completion_token_ids)
    assert rows[0].tool_calls[0]["function"]["name"] == "get_weather"
    assert rows[1].response["message"]["content"] == "Sunny: 18C"


def test_streaming_with_tool_calls(store: InteractionStore, chat_format: ChatFormat) -> None:
    with running_server(make_server(store, chat_format)) as base_url:
        oa = client(base_url)
        stream = oa.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hi there"}], stream=True
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Sunny:" and chunks[-1].choices[0].finish_reason == "stop"
        stream = oa.chat.completions.create(
            model="agent",
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER_TOOL],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert [c.function.name for c in calls] == ["get_weather"]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert store.count() == 2  # streamed turns are logged too


def test_feedback_auth_validation_and_tenant_isolation(store: InteractionStore, chat_format: ChatFormat) -> None:
    with running_server(make_server(store, chat_format)) as base_url:
        done = client(base_url, "key-a").chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hi"}]
        )

        def post(body: dict, key: str | None = "key-a") -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return httpx.post(base_url + "/feedback", json=body, headers=headers, timeout=10)

        good = {"interaction_id": done.id, "kind": "accepted"}
        assert post(good, key=None).status_code == 401
        assert post(good, key="wrong").status_code == 401
        assert post(good, key=ADMIN).status_code == 401  # an admin key is not a tenant
        bad_kind = post({"interaction_id": done.id, "kind": "loved_it"})
        assert bad_kind.status_code == 400 and "kind" in bad_kind.json()["error"]["message"]
        no_rating = post({"interaction_id": done.id, "kind": "rating"})
        assert no_rating.status_code == 400 and "value" in no_rating.json()["error"]["message"]
        assert post({"interaction_id": done.id, "kind": "accepted", "extra": 1}).status_code == 400
        assert post(good, key="key-b").status_code == 404  # another tenant cannot see it exists
        ok = post(good)
        assert ok.status_code == 200 and ok.json()["reward"] == 1.0
        assert post({"interaction_id": done.id, "kind": "rating", "value": 5}).json()["reward"] == 1.0

        as_a, as_b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
        read_a = httpx.get(f"{base_url}/interactions/{done.id}", headers=as_a, timeout=30)
        read_b = httpx.get(f"{base_url}/interactions/{done.id}", headers=as_b, timeout=30)
        assert read_a.status_code == 200 and read_a.json()["completion_token_ids"]
        assert read_b.status_code == 404
        listed_b = httpx.get(f"{base_url}/interactions", headers=as_b, timeout=30)
        assert listed_b.json()["data"] == []
        with pytest.raises(openai.AuthenticationError):
            client(base_url, "wrong").chat.completions.create(
                model="agent", messages=[{"role": "user", "content": "x"}]
            )
        as_tenant = {"Authorization": "Bearer key-a"}
        rollback = httpx.post(f"{base_url}/router/agent", json={"action": "rollback"}, headers=as_tenant, timeout=30)
        assert rollback.status_code == 401
    assert [f.kind for f in store.feedback()] == ["accepted", "rating"]


def test_body_limit_metrics_and_health(store: InteractionStore, chat_format: ChatFormat) -> None:
    with running_server(make_server(store, chat_format, max_body_bytes=4096)) as base_url:
        big = {"model": "agent", "messages": [{"role": "user", "content": "x" * 10_000}]}
        response = httpx.post(base_url + "/chat/completions", json=big, headers={"Authorization": "Bearer key-a"},
                              timeout=30)  # fmt: skip
        assert response.status_code == 413
        client(base_url).chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}])
        root = base_url.removesuffix("/v1")
        assert httpx.get(root + "/health", timeout=30).json()["versions"] == {"agent": 0}
        metrics = httpx.get(root + "/metrics", timeout=30).text
        assert 'taskrl_requests_total{model="agent",route="stable",version="0"} 1.0' in metrics
    assert store.count() == 1


def test_sensitive_tool_needs_approval(store: InteractionStore, chat_format: ChatFormat) -> None:
    asked: list[tuple[str, str]] = []

    def approve(tenant: str, call: Any) -> bool:
        asked.append((tenant, call.name))
        return tenant == "tenant-b"

    app = make_server(store, chat_format, sensitive_tools=("delete_repo",), approve=approve)
    with running_server(app) as base_url:
        body = {"model": "agent", "messages": [{"role": "user", "content": "delete it"}], "tools": [DELETE_TOOL]}
        denied = client(base_url, "key-a").chat.completions.create(**body)
        allowed = client(base_url, "key-b").chat.completions.create(**body)
    assert denied.choices[0].message.tool_calls is None and "withheld" in denied.choices[0].message.content
    assert allowed.choices[0].message.tool_calls[0].function.name == "delete_repo"
    assert asked == [("tenant-a", "delete_repo"), ("tenant-b", "delete_repo")]


def admin_post(base_url: str, path: str, body: dict) -> dict:
    response = httpx.post(base_url + path, json=body, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_canary_split_holdout_and_stickiness(store: InteractionStore, chat_format: ChatFormat) -> None:
    router = RouterConfig(stages=(0.2, 1.0), min_samples=10_000, holdout=0.1)
    app = make_server(store, chat_format, router=router)
    agent = app.state.routers["agent"]
    v1 = agent.add_version(ScriptedPolicy(weather_rule("Rainy:"), name="v1", chat_format=chat_format))
    v2 = agent.add_version(ScriptedPolicy(weather_rule("Foggy:"), name="v2", chat_format=chat_format))
    with running_server(app) as base_url:
        admin_post(base_url, "/router/agent", {"action": "activate", "version": v1})  # v0 becomes the holdout
        admin_post(base_url, "/router/agent", {"action": "canary", "version": v2})
        n = 300
        oa = client(base_url)
        answers = {f"user-{i}": say(oa, f"user-{i}").choices[0].message.content for i in range(n)}
        again = [say(oa, f"user-{i}").choices[0].message.content for i in range(20)]
    assert again == [answers[f"user-{i}"] for i in range(20)]  # sticky per session
    shares = {word: sum(a == word for a in answers.values()) / n for word in ("Sunny:", "Rainy:", "Foggy:")}
    # Expected: holdout 10% on v0; canary 20% of the remaining 90% = 18% on v2; the rest on v1.
    assert abs(shares["Sunny:"] - 0.10) < 4 * (0.1 * 0.9 / n) ** 0.5
    assert abs(shares["Foggy:"] - 0.18) < 4 * (0.18 * 0.82 / n) ** 0.5
    rows = store.interactions()
    assert {(r.policy_version, r.route) for r in rows} == {(0, "holdout"), (v1, "stable"), (v2, "canary")}
    assert [d.kind for d in store.decisions()][-2:] == ["promote", "start_canary"]


def test_shadow_runs_candidate_without_returning_it(store: InteractionStore, chat_format: ChatFormat) -> None:
    app = make_server(store, chat_format, router=RouterConfig(holdout=0.0))
    agent = app.state.routers["agent"]
    v1 = agent.add_version(ScriptedPolicy(weather_rule("Shadowy:"), name="v1", chat_format=chat_format))
    with running_server(app) as base_url:
        admin_post(base_url, "/router/agent", {"action": "shadow", "version": v1})
        oa = client(base_url)
        replies = [say(oa, f"s{i}").choices[0].message.content for i in range(5)]
        admin_post(base_url, "/router/agent", {"action": "stop_shadow"})
    assert replies == ["Sunny:"] * 5
    shadow = [r for r in store.interactions() if r.shadow]
    assert len(shadow) == 5 and {r.policy_version for r in shadow} == {v1}
    assert all(r.response["message"]["content"] == "Shadowy:" for r in shadow)
    served = store.interactions(include_shadow=False)
    assert len(served) == 5 and not any(r.shadow for r in served)


def test_live_regression_rolls_the_canary_back(store: InteractionStore, chat_format: ChatFormat) -> None:
    router = RouterConfig(stages=(0.5, 1.0), min_samples=1000, holdout=0.0, rollback_min_samples=15)
    app = make_server(store, chat_format, router=router)
    agent = app.state.routers["agent"]
    bad = agent.add_version(ScriptedPolicy(weather_rule("Wrong:"), name="bad", chat_format=chat_format))
    with running_server(app) as base_url:
        admin_post(base_url, "/router/agent", {"action": "canary", "version": bad})
        rolled_back_at = None
        oa = client(base_url)
        for i in range(200):
            key = ("key-a", "key-b")[i % 2]  # two tenants: neither may decide alone (max_tenant_share 0.5)
            reply = say(client(base_url, key), f"u{i}")
            # The simulated user accepts the stable answer and rejects the injected regression.
            kind = "rejected" if reply.choices[0].message.content.startswith("Wrong") else "accepted"
            result = httpx.post(
                base_url + "/feedback",
                json={"interaction_id": reply.id, "kind": kind},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            ).json()
            if result["decision"] == "rollback":
                rolled_back_at = i
                break
        assert rolled_back_at is not None
        after = [say(oa, f"u{i}").choices[0].message.content for i in range(30)]
    assert all(a == "Sunny:" for a in after)
    rollback = [d for d in store.decisions() if d.kind == "rollback"]
    assert len(rollback) == 1 and rollback[0].from_version == bad
    assert rollback[0].evidence["ci"][1] < 0 and rollback[0].evidence["candidate_n"] >= 15


def test_proxying_an_upstream_server_logs_its_tokens(
    store: InteractionStore, chat_format: ChatFormat, tmp_path: Path
) -> None:
    from taskrl.policies.openai import OpenAIPolicy

    upstream_policy = ScriptedPolicy(weather_rule("Upstream:"), chat_format=chat_format)
    with InteractionStore(f"sqlite:///{tmp_path / 'upstream.db'}", sqlite_synchronous="NORMAL") as upstream_store:
        upstream_app = create_app({"base": upstream_policy}, store=upstream_store)
        with running_server(upstream_app) as upstream_url:
            proxy = OpenAIPolicy(upstream_url, "base", timeout_s=30)
            proxy_app = create_app({"agent": proxy}, store=store, config=ServeConfig(api_keys=KEYS))
            with running_server(proxy_app) as base_url:
                reply = say(client(base_url), "p1")
        upstream_row = upstream_store.interactions()[0]
    assert reply.choices[0].message.content == "Upstream:"
    row = store.interactions()[0]
    assert row.completion_token_ids == upstream_row.completion_token_ids and row.completion_token_ids
    assert row.prompt_token_ids == upstream_row.prompt_token_ids


def hostile_upstream(depth: int, *, raw_body: bool) -> Any:
    """An OpenAI-compatible server (not taskrl's) answering one tool call whose arguments nest ``depth`` deep."""
    import fastapi
    from fastapi.responses import Response

    upstream = fastapi.FastAPI()
    arguments = '{"city": ' + "[" * depth + "]" * depth + "}"

    @upstream.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @upstream.post("/v1/chat/completions")
    async def chat() -> Response:
        if raw_body:  # the arguments as a JSON object, so the body itself nests past any decoder
            call = '{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ' + arguments
            body = '{"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [' + call + "}}]}}]}"
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}
            body = json.dumps({"choices": [{"message": message, "finish_reason": "tool_calls"}]})
        return Response(body, media_type="application/json")

    return upstream


@pytest.mark.parametrize("depth", [40, 5000])
def test_proxying_an_upstream_that_nests_arguments_absurdly_deep(
    store: InteractionStore, depth: int
) -> None:
    """Issue 18 leftover: OpenAIPolicy raised RecursionError (an unhandled 500) on arguments nested 5,000 deep."""
    from taskrl.policies.openai import OpenAIPolicy

    with running_server(hostile_upstream(depth, raw_body=False)) as upstream_url:
        proxy = OpenAIPolicy(upstream_url, "base", timeout_s=30, max_retries=0)
        with running_server(create_app({"agent": proxy}, store=store, config=ServeConfig(api_keys=KEYS))) as url:
            reply = say(client(url), "p1", "weather?")
            call = reply.choices[0].message.tool_calls[0]
            assert call.function.name == "get_weather" and "__" in call.function.arguments  # kept, marked
        with running_server(hostile_upstream(depth, raw_body=True)) as raw_url:
            proxy = OpenAIPolicy(raw_url, "base", timeout_s=30, max_retries=0)
            with running_server(create_app({"agent": proxy}, store=store, config=ServeConfig(api_keys=KEYS))) as url:
                if depth < 900:  # decodable: the call is bounded like the string form
                    assert say(client(url), "p2", "weather?").choices[0].message.tool_calls
                else:
                    with pytest.raises(openai.InternalServerError) as failed:
                        say(client(url), "p2", "weather?")
                    assert failed.value.code == "policy_error" and "non-JSON body" in failed.value.message
    rows = store.interactions()
    assert len(rows) == (2 if depth < 900 else 1)  # every answered turn is stored, the failed one is not
    assert all(json.dumps(r.tool_calls) for r in rows)

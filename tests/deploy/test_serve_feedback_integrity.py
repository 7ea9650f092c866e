"""Issue 16, Medium: feedback integrity and per-tenant limits, attacked through a real server and store.

One signal per (interaction, kind), latest wins (SQLite and PostgreSQL); the router counts distinct sessions
and caps each tenant's share, so 100 ``accepted`` posts cannot promote a canary and 30 rejects from one
tenant cannot roll a good one back; the session salt is secret per deployment; rate and concurrency limits
answer 429 in OpenAI's shape. Also the tenant read API: paginated in SQL, shadow rows hidden.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from taskrl.chat import ChatFormat
from taskrl.deploy.config import ServeConfig
from taskrl.deploy.errors import APIError
from taskrl.deploy.limits import TenantLimiter
from taskrl.deploy.router import Router, RouterConfig
from taskrl.deploy.server import create_app, running_server
from taskrl.deploy.store import InteractionStore
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b", "key-c": "tenant-c"}


@pytest.fixture(scope="module")
def chat_format() -> ChatFormat:
    return ChatFormat(smollm2_tokenizer())


def scripted(answer: str, chat_format: ChatFormat) -> ScriptedPolicy:
    return ScriptedPolicy(lambda messages, tools: answer, name=answer, chat_format=chat_format)


@pytest.fixture
def canary_server(store_url: str, chat_format: ChatFormat) -> Iterator[tuple[str, Router, InteractionStore]]:
    with InteractionStore(store_url) as store:
        # advance_margin 2 (rewards lie in [-1, 1]): these tests are about tenant caps, so any candidate whose live
        # test runs on enough counted sessions, and is not significantly worse, advances
        router_config = RouterConfig(stages=(0.5, 1.0), min_samples=10, rollback_min_samples=10, holdout=0.0,
                                     advance_margin=2.0)  # fmt: skip
        app = create_app({"agent": scripted("stable", chat_format)}, store=store,
                         config=ServeConfig(api_keys=KEYS, router=router_config))  # fmt: skip
        router = app.state.routers["agent"]
        router.start_canary(router.add_version(scripted("canary", chat_format)))
        with running_server(app) as url:
            yield url, router, store


def canary_reply(oa: openai.OpenAI, prefix: str, arm: str = "canary") -> Any:
    """A reply served by the canary, or the ``arm`` named (sessions are hashed to arms; try fresh ones)."""
    for i in range(200):
        reply = oa.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}],
                                           extra_headers={"x-session-id": f"{prefix}-{i}"})  # fmt: skip
        if reply.choices[0].message.content == arm:
            return reply
    raise AssertionError(f"no session landed on the {arm}")


def feedback(url: str, key: str, interaction_id: str, kind: str) -> dict[str, Any]:
    reply = httpx.post(url + "/feedback", json={"interaction_id": interaction_id, "kind": kind},
                       headers={"Authorization": f"Bearer {key}"}, timeout=30)  # fmt: skip
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_repeated_feedback_counts_once_and_the_latest_wins(canary_server: tuple) -> None:
    url, router, store = canary_server
    oa = openai.OpenAI(base_url=url, api_key="key-a", max_retries=0, timeout=30)
    reply = canary_reply(oa, "flood")
    decisions = {feedback(url, "key-a", reply.id, "accepted")["decision"] for _ in range(40)}
    assert decisions == {None} and router.stage == 0
    live = router.live[router.candidate].sessions
    assert len(live) == 1 and [len(signals) for signals in live.values()] == [1]  # 40 posts: one signal
    feedback(url, "key-a", reply.id, "rejected")
    feedback(url, "key-a", reply.id, "accepted")  # changed their mind: the latest accepted replaces the first
    stored = store.feedback(interaction_ids=[reply.id])
    assert sorted(f.kind for f in stored) == ["accepted", "rejected"]
    with store.engine.connect() as conn:  # one row per (interaction, kind) in the table itself, not just on read
        from taskrl.deploy.store import FEEDBACK

        assert len(conn.execute(FEEDBACK.select()).all()) == 2


def test_one_tenant_cannot_promote_or_roll_back_a_canary(canary_server: tuple) -> None:
    url, router, _ = canary_server
    evil = openai.OpenAI(base_url=url, api_key="key-a", max_retries=0, timeout=30)
    for i in range(12):  # 12 distinct canary sessions, all rejected, from one tenant
        feedback(url, "key-a", canary_reply(evil, f"evil{i}").id, "rejected")
    assert router.candidate is not None and router.stage == 0, router.state()  # no rollback, no advance
    assert router.stage_samples == 0  # a lone tenant's sessions count for nothing (max_tenant_share 0.5)
    for i, (key, kind) in enumerate([("key-b", "accepted"), ("key-c", "rejected")] * 3):  # stable's live evidence
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=30)
        feedback(url, key, canary_reply(client, f"stable{i}", "stable").id, kind)
    for i, key in enumerate(["key-b", "key-c"] * 6):  # two more tenants accept: now the evidence is shared
        client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=30)
        feedback(url, key, canary_reply(client, f"good{i}").id, "accepted")
    assert router.stage == 1 or router.stable != 0, router.state()  # advanced on balanced, distinct sessions


def test_the_session_salt_is_secret_per_deployment(chat_format: ChatFormat) -> None:
    def arms(config: RouterConfig) -> list[str]:
        router = Router("m", scripted("a", chat_format), config)
        router.start_canary(router.add_version(scripted("b", chat_format)))
        return [router.route(f"s{i}")[1] for i in range(400)]

    default = RouterConfig(stages=(0.5, 1.0), holdout=0.0)
    assert arms(default) != arms(default)  # a random secret each deployment: not computable by clients
    fixed = RouterConfig(stages=(0.5, 1.0), holdout=0.0, salt="deployment-secret")
    assert arms(fixed) == arms(fixed)  # configured (TASKRL_ROUTER_SALT): sticky across restarts


async def test_rate_and_concurrency_limits_answer_429(tmp_path: Path, chat_format: ChatFormat) -> None:
    entered = threading.Semaphore(0)  # released when a request reaches the policy (the server runs in a thread)
    release = threading.Event()

    class Slow(ScriptedPolicy):
        async def generate(self, **kwargs: Any) -> Any:
            entered.release()
            while not release.is_set():
                await asyncio.sleep(0.01)
            return await super().generate(**kwargs)

    async def reached_policy() -> None:  # waits on the condition, not on a guess of how slow the machine is
        assert await asyncio.to_thread(entered.acquire, timeout=60), "request never reached the policy"

    policy = Slow(lambda messages, tools: "ok", chat_format=chat_format)
    # 1/minute: a bucket of one request that refills in 60 s, so no refill can happen during the test however
    # slow the machine is (the burst size and refill rate are tested on the limiter's own clock below).
    config = ServeConfig(api_keys=KEYS, rate_limit_per_minute=1, max_concurrent_per_tenant=1)
    app = create_app({"agent": policy}, config=config)
    body = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}
    with running_server(app) as url:
        a = openai.AsyncOpenAI(base_url=url, api_key="key-a", max_retries=0, timeout=60)
        b = openai.AsyncOpenAI(base_url=url, api_key="key-b", max_retries=0, timeout=60)
        first = asyncio.ensure_future(a.chat.completions.create(**body))
        await reached_policy()
        with pytest.raises(openai.RateLimitError) as busy:
            await a.chat.completions.create(**body)
        assert busy.value.code == "concurrency_limit_exceeded"
        other_tenant = asyncio.ensure_future(b.chat.completions.create(**body))  # not affected by tenant-a
        await reached_policy()
        release.set()
        assert (await first).choices[0].message.content == "ok"
        assert (await other_tenant).choices[0].message.content == "ok"
        with pytest.raises(openai.RateLimitError) as limited:  # the refused concurrent call took no token
            await a.chat.completions.create(**body)
        assert limited.value.code == "rate_limit_exceeded"
        assert int(limited.value.response.headers["retry-after"]) >= 1
        await a.close()
        await b.close()


def test_the_rate_limit_bursts_ten_seconds_and_refills_continuously(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("taskrl.deploy.limits.time.monotonic", lambda: clock[0])
    limiter = TenantLimiter(per_minute=12, max_concurrent=None)  # 0.2/s: a burst of 2, one more every 5 s

    def admitted(tenant: str = "a") -> bool:
        try:
            with limiter.hold(tenant):
                return True
        except APIError as exc:
            assert exc.status == 429 and exc.code == "rate_limit_exceeded" and exc.headers
            return False

    assert [admitted(), admitted(), admitted()] == [True, True, False]
    assert admitted("b")  # another tenant has its own bucket
    clock[0] += 4.9
    assert not admitted()
    clock[0] += 0.2
    assert [admitted(), admitted()] == [True, False]


def test_listing_is_paginated_in_sql_and_hides_shadow_rows(store_url: str, chat_format: ChatFormat) -> None:
    with InteractionStore(store_url) as store:
        app = create_app({"agent": scripted("v0", chat_format)}, store=store, config=ServeConfig(api_keys=KEYS))
        router = app.state.routers["agent"]
        router.set_shadow(router.add_version(scripted("shadow", chat_format)))
        with running_server(app) as url:
            oa = openai.OpenAI(base_url=url, api_key="key-a", max_retries=0, timeout=30)
            ids = [oa.chat.completions.create(model="agent", messages=[{"role": "user", "content": f"q{i}"}]).id
                   for i in range(5)]  # fmt: skip
            auth = {"Authorization": "Bearer key-a"}
            for _ in range(100):  # shadow runs finish in the background
                if store.count() == 10:
                    break
                asyncio.run(asyncio.sleep(0.05))
            pages, after = [], None
            while True:
                params = {"limit": 2, **({"after": after} if after else {})}
                page = httpx.get(url + "/interactions", params=params, headers=auth).json()
                pages.append([row["id"] for row in page["data"]])
                if not page["has_more"]:
                    break
                after = page["last_id"]
            shadow_ids = [r.id for r in store.interactions() if r.shadow]
            hidden = httpx.get(url + f"/interactions/{shadow_ids[0]}", headers=auth)
        assert store.count() == 10 and len(shadow_ids) == 5
    assert pages == [ids[::-1][0:2], ids[::-1][2:4], ids[::-1][4:5]]  # newest first, no shadow rows
    assert hidden.status_code == 404

"""The server's non-chat endpoints: feedback, per-tenant interaction reads, adapter hot-load, router control, metrics.

``add_deploy_routes(app)`` mounts them on the app ``create_app`` built (it reads ``app.state``: routers,
store, config, metrics). Feedback and reads need a tenant API key; adapter loading and router control need
an admin key; a tenant only ever sees its own interactions (another tenant's id is a 404, not a 403).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import defaultdict
from typing import Any, Literal

import fastapi
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from taskrl.deploy.errors import APIError
from taskrl.deploy.feedback import FeedbackIn
from taskrl.deploy.router import Router, RouterError
from taskrl.deploy.store import Feedback, Interaction, StoreError
from taskrl.policies.base import Policy, PolicyError


class ServerMetrics:
    """Counters and latency sums, rendered in Prometheus' text format at ``/metrics``."""

    def __init__(self) -> None:
        self.counters: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
        self.overhead_ms_sum = 0.0
        self.policy_ms_sum = 0.0
        self.timed = 0

    def count(self, name: str, *labels: Any) -> None:
        self.counters[(name, tuple(str(x) for x in labels))] += 1

    def observe_overhead(self, overhead_ms: float, policy_ms: float) -> None:
        self.overhead_ms_sum += overhead_ms
        self.policy_ms_sum += policy_ms
        self.timed += 1

    def render(self, routers: dict[str, Router]) -> str:
        label_names = {
            "requests": ("model", "version", "arm"),
            "feedback": ("model", "version", "kind"),
        }
        lines = []
        for (name, labels), value in sorted(self.counters.items()):
            keys = label_names.get(name, ("model", "version"))
            rendered = ",".join(f'{k}="{v}"' for k, v in zip(keys, labels, strict=False))
            lines.append(f"taskrl_{name}_total{{{rendered}}} {value}")
        lines.append(f"taskrl_server_overhead_ms_sum {self.overhead_ms_sum:.3f}")
        lines.append(f"taskrl_policy_ms_sum {self.policy_ms_sum:.3f}")
        lines.append(f"taskrl_timed_requests_total {self.timed}")
        for name, router in sorted(routers.items()):
            lines.append(f'taskrl_stable_version{{model="{name}"}} {router.stable}')
            if router.candidate is not None:
                share = router.config.stages[router.stage]
                lines.append(f'taskrl_canary_share{{model="{name}",version="{router.candidate}"}} {share}')
        return "\n".join(lines) + "\n"


class LoadAdapterIn(BaseModel):
    """vLLM's ``/v1/load_lora_adapter`` body plus taskrl's routing fields."""

    model_config = {"extra": "forbid"}

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1)
    model: str | None = None
    """Attach the adapter as a new version of this served model (else it is served as ``lora_name``)."""
    base_model: str | None = None
    """Served model whose weights the adapter applies to (default: ``model``, or the only served model)."""
    rollout: Literal["none", "canary", "activate", "shadow"] = "none"
    """With ``model``: start a canary, switch at once, or shadow the new version."""


class UnloadAdapterIn(BaseModel):
    """vLLM's ``/v1/unload_lora_adapter`` body."""

    model_config = {"extra": "forbid"}

    lora_name: str = Field(min_length=1, max_length=256)


class RouterActionIn(BaseModel):
    model_config = {"extra": "forbid"}

    action: Literal["canary", "shadow", "activate", "rollback", "stop_shadow"]
    version: int | None = None


async def adapter_policy(base: Policy, name: str, path: str) -> Policy:
    """A new policy = ``base`` + LoRA adapter at ``path``; ``base`` keeps serving unchanged meanwhile."""
    from taskrl.policies.hf import HFPolicy
    from taskrl.policies.openai import OpenAIPolicy

    if isinstance(base, OpenAIPolicy):  # proxying vLLM & co: the upstream loads it, we select it by name
        upstream = OpenAIPolicy(base.base_url, base.model, name=name, api_key=base.api_key, timeout_s=base.timeout_s)
        await upstream.load_lora_adapter(name, path)
        return upstream
    if not isinstance(base, HFPolicy):
        raise APIError(400, f"cannot apply a LoRA adapter to a {type(base).__name__}; serve an HFPolicy")

    def build() -> HFPolicy:
        from peft import PeftModel

        # A copy: in-flight requests keep decoding with the old weights while the new version is built.
        merged = PeftModel.from_pretrained(copy.deepcopy(base.model), path).merge_and_unload()
        return HFPolicy(merged, base.tokenizer, name=name, device=base.device, chat_format=base.chat_format)

    try:
        return await asyncio.to_thread(build)
    except (OSError, ValueError) as exc:
        raise APIError(400, f"cannot load LoRA adapter from {path!r}: {exc}") from exc


def adapters(state: Any) -> set[str]:
    """Names of the models this server created by loading an adapter (the only ones it may unload)."""
    if not hasattr(state, "adapters"):
        state.adapters = set()
    return state.adapters


def add_deploy_routes(app: fastapi.FastAPI) -> None:
    """Mount feedback, interactions, adapter, router and metrics endpoints on ``app``."""
    state = app.state

    def tenant(http: fastapi.Request) -> str:
        found = state.config.tenant_of(http.headers.get("authorization"))
        if found is None:
            raise APIError(401, "missing or unknown API key; send Authorization: Bearer <key>", "authentication_error")
        return found

    def admin(http: fastapi.Request) -> None:
        if not state.config.is_admin(http.headers.get("authorization")):
            raise APIError(401, "admin endpoint: send Authorization: Bearer <admin key>", "authentication_error")

    def need_store() -> Any:
        if state.store is None:
            raise APIError(503, "no interaction store configured; start the server with a store URL", "server_error")
        return state.store

    async def own_interaction(interaction_id: str, tenant_name: str) -> Interaction:
        found = await asyncio.to_thread(need_store().get_interaction, interaction_id, tenant=tenant_name)
        if found is None:
            raise APIError(404, f"no interaction {interaction_id!r} for this API key")
        return found

    @app.post("/v1/feedback")
    async def feedback(body: FeedbackIn, http: fastapi.Request) -> dict[str, Any]:
        who = tenant(http)
        interaction = await own_interaction(body.interaction_id, who)
        record = Feedback(interaction.id, who, body.kind, body.value)
        try:
            await need_store().add("feedback", record)
        except StoreError as exc:
            raise APIError(503, f"feedback not stored, retry: {exc}", "server_error") from exc
        reward = state.config.reward_map.signal_reward(record)
        router = state.routers.get(interaction.model)
        decision = None
        if reward is not None and router is not None and not interaction.shadow:
            decision = router.observe(interaction.policy_version, reward)
        state.metrics.count("feedback", interaction.model, interaction.policy_version, body.kind)
        return {
            "id": record.id,
            "interaction_id": interaction.id,
            "reward": reward,
            "decision": None if decision is None else decision.kind,
        }

    @app.get("/v1/interactions/{interaction_id}")
    async def get_interaction(interaction_id: str, http: fastapi.Request) -> dict[str, Any]:
        found = await own_interaction(interaction_id, tenant(http))
        return found.__dict__

    @app.get("/v1/interactions")
    async def list_interactions(http: fastapi.Request, session_id: str | None = None, limit: int = 100) -> dict:
        who = tenant(http)
        rows = await asyncio.to_thread(need_store().interactions, tenant=who, session_id=session_id)
        return {"object": "list", "data": [r.__dict__ for r in rows[-max(1, min(limit, 1000)) :]]}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadAdapterIn, http: fastapi.Request) -> dict[str, Any]:
        admin(http)
        routers: dict[str, Router] = state.routers
        base_name = body.base_model or body.model
        if base_name is None:
            if len(routers) != 1:
                raise APIError(400, f"several models are served ({', '.join(sorted(routers))}); name base_model")
            base_name = next(iter(routers))
        if base_name not in routers:
            raise APIError(404, f"base model {base_name!r} is not served here")
        base_router = routers[base_name]
        started = time.perf_counter()
        try:
            policy = await adapter_policy(base_router.policy(base_router.stable), body.lora_name, body.lora_path)
        except PolicyError as exc:
            raise APIError(502, f"upstream could not load the adapter: {exc}", "server_error") from exc
        load_s = time.perf_counter() - started
        if body.model is None:
            if body.lora_name in routers:
                raise APIError(409, f"model {body.lora_name!r} is already served; pick another lora_name")
            routers[body.lora_name] = Router(body.lora_name, policy, state.config.router, on_decision=_log(state))
            adapters(state).add(body.lora_name)
            return {"model": body.lora_name, "version": policy.version, "load_s": load_s}
        target = routers.get(body.model)
        if target is None:
            raise APIError(404, f"model {body.model!r} is not served here")
        version = target.add_version(policy)
        try:
            if body.rollout == "canary":
                target.start_canary(version)
            elif body.rollout == "activate":
                target.activate(version, {"lora_path": body.lora_path})
            elif body.rollout == "shadow":
                target.set_shadow(version)
        except RouterError as exc:
            raise APIError(409, str(exc)) from exc
        return {"model": body.model, "version": version, "load_s": load_s, "router": target.state()}

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadAdapterIn, http: fastapi.Request) -> dict[str, Any]:
        """Stop serving an adapter loaded as its own model; requests already running on it finish."""
        admin(http)
        if body.lora_name not in adapters(state):
            raise APIError(404, f"no adapter named {body.lora_name!r} was loaded here (base models stay served)")
        router = state.routers.pop(body.lora_name)
        adapters(state).discard(body.lora_name)
        # The policy is not closed: a request routed to it just before may still be decoding. Dropping the last
        # reference frees the weights once it is done; a proxied upstream (vLLM) is told to unload its copy.
        from taskrl.policies.openai import OpenAIPolicy

        policy = router.policy(router.stable)
        if isinstance(policy, OpenAIPolicy):
            try:
                await policy.unload_lora_adapter(body.lora_name)
            except PolicyError as exc:
                raise APIError(502, f"upstream could not unload the adapter: {exc}", "server_error") from exc
        return {"model": body.lora_name, "unloaded": True}

    @app.get("/v1/router/{model}")
    async def router_state(model: str, http: fastapi.Request) -> dict[str, Any]:
        admin(http)
        return _router(state, model).state()

    @app.post("/v1/router/{model}")
    async def router_action(model: str, body: RouterActionIn, http: fastapi.Request) -> dict[str, Any]:
        admin(http)
        router = _router(state, model)
        needs_version = body.action in ("canary", "shadow", "activate")
        if needs_version and body.version is None:
            raise APIError(422, f"invalid request: version: required for action {body.action!r}")
        try:
            if body.action == "canary":
                router.start_canary(body.version)  # type: ignore[arg-type]
            elif body.action == "shadow":
                router.set_shadow(body.version)
            elif body.action == "activate":
                router.activate(body.version)  # type: ignore[arg-type]
            elif body.action == "rollback":
                router.rollback({"requested": True})
            else:
                router.set_shadow(None)
        except RouterError as exc:
            raise APIError(409, str(exc)) from exc
        return router.state()

    @app.get("/v1/decisions")
    async def decisions(http: fastapi.Request, model: str | None = None) -> dict[str, Any]:
        admin(http)
        rows = [d.__dict__ for r in state.routers.values() for d in r.decisions if model in (None, r.model)]
        return {"object": "list", "data": sorted(rows, key=lambda d: d["created_at"])}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(state.routers))


def _router(state: Any, model: str) -> Router:
    router = state.routers.get(model)
    if router is None:
        raise APIError(404, f"model {model!r} is not served here")
    return router


def _log(state: Any) -> Any:
    return (lambda d: state.store.submit("decisions", d)) if state.store is not None else None

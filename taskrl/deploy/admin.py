"""The server's non-chat endpoints: feedback, per-tenant interaction reads, adapter hot-load, router control, metrics.

``add_deploy_routes(app)`` mounts them on the app ``create_app`` built (it reads ``app.state``: routers,
store, config, metrics). Feedback and reads need a tenant API key; adapter loading and router control need
an admin key; a tenant only ever sees its own, delivered-or-not, non-shadow interactions (another tenant's id is
a 404, not a 403). Feedback is one signal per (interaction, kind), latest wins, in the store and in the router's
live evidence. Adapters are loaded only when runtime loading is enabled, only from below ``adapter_root`` when
one is set, and only when every weight is finite.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from typing import Any, Literal

import fastapi
from fastapi.responses import Response
from pydantic import BaseModel, Field

from taskrl.deploy.errors import APIError
from taskrl.deploy.feedback import FeedbackIn
from taskrl.deploy.router import Router, RouterError
from taskrl.deploy.store import Feedback, Interaction, StoreError
from taskrl.policies.base import Policy, PolicyError


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

    if _is_vllm(base):  # --backend vllm: the adapter is loaded into the same vLLM, sampled token in, token out
        from taskrl.deploy import vllm_backend

        return await vllm_backend.adapter_policy(base, name, path)
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
        bad = non_finite_parameters(merged)
        if bad:  # a poisoned adapter (NaN/inf weights) would answer garbage with NaN logprobs
            raise ValueError(f"adapter has non-finite weights in {len(bad)} tensors (e.g. {bad[0]}); refused")
        return HFPolicy(merged, base.tokenizer, name=name, device=base.device, chat_format=base.chat_format)

    try:
        return await asyncio.to_thread(build)
    except (OSError, ValueError) as exc:
        raise APIError(400, f"cannot load LoRA adapter from {path!r}: {exc}") from exc


def _is_vllm(policy: Any) -> bool:
    from taskrl.policies.openai import OpenAIPolicy

    if not isinstance(policy, OpenAIPolicy) or policy.chat_format is None:
        return False
    from taskrl.policies.vllm import VLLMPolicy

    return isinstance(policy, VLLMPolicy)


def non_finite_parameters(model: Any) -> list[str]:
    """Names of the model's tensors holding NaN or inf."""
    import torch

    with torch.no_grad():
        return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]


def check_adapter_path(config: Any, path: str) -> str:
    """``path`` resolved; refused unless runtime loading is on and it lies below ``config.adapter_root``."""
    if not config.allow_runtime_lora:
        raise APIError(403, "runtime adapter loading is disabled; start taskrl serve with --allow-runtime-lora",
                       "permission_error", param="lora_path", code="runtime_lora_disabled")  # fmt: skip
    resolved = os.path.realpath(path)
    if config.adapter_root is not None:
        root = os.path.realpath(config.adapter_root)
        if os.path.commonpath([root, resolved]) != root:
            raise APIError(403, f"lora_path must lie below the adapter root {config.adapter_root!r}",
                           "permission_error", param="lora_path", code="path_not_allowed")  # fmt: skip
    return resolved


def adapters(state: Any) -> set[str]:
    """Names of the models this server created by loading an adapter (the only ones it may unload)."""
    if not hasattr(state, "adapters"):
        state.adapters = set()
    return state.adapters


def lora_names(state: Any) -> set[str]:
    """Every ``lora_name`` this server has loaded (unloaded ones included): a name is never given new weights."""
    if not hasattr(state, "lora_names"):
        state.lora_names = set()
    return state.lora_names


def check_new_lora_name(state: Any, name: str) -> None:
    """409 unless ``name`` is new: it must name no served model and no adapter loaded before.

    Serving engines key their prefix caches on the adapter's name (vLLM: its name and integer id), so new weights
    under a used name would be served from KV computed with the old ones; every update gets a fresh name."""
    if name in state.routers or name in lora_names(state):
        where = "a served model" if name in state.routers else "an adapter loaded before"
        raise APIError(409, f"lora_name {name!r} already names {where}; adapter names are never reused (caches are "
                       f"keyed on them): load the new weights under a new name, e.g. {name + '-v2'!r}",
                       param="lora_name", code="lora_name_taken")  # fmt: skip


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
        with state.limiter.hold(who):
            return await record_feedback(body, who)

    async def record_feedback(body: FeedbackIn, who: str) -> dict[str, Any]:
        try:
            interaction = await own_interaction(body.interaction_id, who)
        except StoreError as exc:
            raise APIError(503, f"feedback not stored, retry: {exc}", "server_error", code="store_unavailable") from exc
        record = Feedback(interaction.id, who, body.kind, body.value)
        try:
            await need_store().add("feedback", record)
        except StoreError as exc:
            raise APIError(503, f"feedback not stored, retry: {exc}", "server_error", code="store_unavailable") from exc
        reward = state.config.reward_map.signal_reward(record)
        router = state.routers.get(interaction.model)
        decision = None
        if reward is not None and router is not None and interaction.delivered:
            decision = router.observe(
                interaction.policy_version,
                reward,
                session_id=interaction.session_id,
                tenant=who,
                key=record.id,  # one per (interaction, kind): a repeated signal replaces, never adds
            )
        state.metrics.feedback.labels(interaction.model, str(interaction.policy_version), body.kind).inc()
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
    async def list_interactions(
        http: fastapi.Request, session_id: str | None = None, limit: int = 100, after: str | None = None
    ) -> dict:
        """Newest first; ``after`` = the last id of the previous page (OpenAI's list pagination)."""
        who = tenant(http)
        if not 1 <= limit <= 1000:
            raise APIError(400, "limit: must be between 1 and 1000", param="limit", code="invalid_value")
        try:
            rows, more = await asyncio.to_thread(
                need_store().interaction_page, tenant=who, session_id=session_id, limit=limit, after=after
            )
        except StoreError as exc:
            raise APIError(400 if after else 503, str(exc), param="after" if after else None) from exc
        data = [r.__dict__ for r in rows]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }

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
        if body.model is not None and body.model not in routers:
            raise APIError(404, f"model {body.model!r} is not served here")
        base_router = routers[base_name]
        path = check_adapter_path(state.config, body.lora_path)
        check_new_lora_name(state, body.lora_name)
        lora_names(state).add(body.lora_name)  # reserved now: a concurrent load of the same name is refused
        started = time.perf_counter()
        try:
            policy = await adapter_policy(base_router.policy(base_router.stable), body.lora_name, path)
        except BaseException as exc:
            lora_names(state).discard(body.lora_name)  # nothing was served under it: the name stays free
            if isinstance(exc, PolicyError):
                raise APIError(502, f"upstream could not load the adapter: {exc}", "server_error") from exc
            raise
        load_s = time.perf_counter() - started
        adapter = {"name": body.lora_name, "path": path}
        if body.model is None:
            routers[body.lora_name] = Router(
                body.lora_name, policy, state.router_config, on_decision=_log(state), adapter=adapter
            )
            adapters(state).add(body.lora_name)
            return {"model": body.lora_name, "version": policy.version, "load_s": load_s}
        target = routers[body.model]
        version = target.add_version(policy, adapter)
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
                if _is_vllm(policy):
                    from taskrl.deploy.vllm_backend import unload_adapter

                    await unload_adapter(policy, body.lora_name)
                else:
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
            raise APIError(400, f"version: required for action {body.action!r}", param="version")
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
    async def metrics() -> Response:
        payload, content_type = state.metrics.render(state.routers, state.store)
        return Response(payload, media_type=content_type)


def _router(state: Any, model: str) -> Router:
    router = state.routers.get(model)
    if router is None:
        raise APIError(404, f"model {model!r} is not served here")
    return router


def _log(state: Any) -> Any:
    return (lambda d: state.store.submit("decisions", d)) if state.store is not None else None

"""taskrl's OpenAI-compatible server: ``/v1/chat/completions`` (tools, streaming) and ``/v1/completions`` over
routed ``Policy`` versions.

``create_app({"name": policy}, store=InteractionStore(url), config=ServeConfig(...))`` builds the FastAPI app:
each model gets a ``Router`` (canary, holdout, shadow), and ``admin.py`` adds feedback, adapter hot-load, router
control and metrics. A request is validated at the edge (``generation.plan_turn``) before it can join a decode
batch; its generation is a task that is cancelled when the client disconnects or the per-request time limit
passes (nothing is logged then). A served turn is rendered to bytes first, then logged with its exact tokens
(committed, or spooled during a database outage; when neither is possible the response is refused, never
delivered unlogged), then sent; a stream that breaks marks its row undelivered. A chat stream from an engine that
streams (``HFPolicy``) sends content as it is sampled and only its end (tool calls, finish reason, ``[DONE]``) after
the turn is logged: a turn that cannot be logged ends with an error event, never ``[DONE]``. Every error is
OpenAI-shaped JSON. ``serve`` runs it in the foreground (drained on SIGTERM), ``running_server`` (``thread.py``) in a
thread.
Responses carry vLLM's extension fields (``token_ids``, ``prompt_token_ids``) when ``return_token_ids`` is set.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import fastapi
import uvicorn
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from taskrl.deploy.admin import add_deploy_routes
from taskrl.deploy.completions import CompletionRequest, completion_body, completion_events, plan_completion
from taskrl.deploy.config import ServeConfig
from taskrl.deploy.delivery import Admission, ClosingStream, Delivery, LiveTurn, streams_tokens
from taskrl.deploy.errors import APIError, api_error_response, describe_validation, error_response
from taskrl.deploy.generation import (
    ChatResult,
    TurnPlan,
    finish_turn,
    generate_chat,
    logprob_entry,
    parse_hermes_tool_calls,
    plan_turn,
    response_body,
)
from taskrl.deploy.limits import TenantLimiter
from taskrl.deploy.metrics import ServerMetrics
from taskrl.deploy.middleware import BodySizeLimit, CatchAll, CloseWhileDraining, RequestId
from taskrl.deploy.router import Router
from taskrl.deploy.schemas import ChatCompletionRequest, SamplingRequest
from taskrl.deploy.store import Interaction, InteractionStore, StoreError, new_id
from taskrl.deploy.streaming import ContentStream, StreamEvents, sse_chunks
from taskrl.deploy.thread import KEEP_ALIVE_S, DrainingServer, ServerThread, running_server
from taskrl.policies.base import Completion, InvalidRequestError, Policy, PolicyError, SamplingParams

__all__ = ["ChatResult", "ServerThread", "create_app", "generate_chat", "running_server", "serve"]
_parse_hermes_tool_calls = parse_hermes_tool_calls  # the name earlier callers imported
DEFAULT_TENANT = "default"
logger = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client disconnected before its turn was ready."""


@dataclass(frozen=True)
class Endpoint:
    """What differs between chat and text completions: planning a turn, its response body and its stream."""

    plan: Callable[..., TurnPlan]
    body: Callable[[ChatResult, Any, Policy], dict[str, Any]]
    events: Callable[..., list[str]]


CHAT = Endpoint(plan_turn, response_body, sse_chunks)
TEXT = Endpoint(plan_completion, completion_body, completion_events)


def _session_of(http: fastapi.Request, request: SamplingRequest, config: ServeConfig) -> str:
    return (http.headers.get(config.session_header) or request.user or new_id("session"))[:256]


def _chat_tenant(config: ServeConfig, authorization: str | None) -> str:
    if not config.api_keys:
        return DEFAULT_TENANT
    tenant = config.tenant_of(authorization)
    if tenant is None:
        raise APIError(401, "missing or unknown API key; send Authorization: Bearer <key>", "authentication_error")
    return tenant


async def _withhold_unapproved(config: ServeConfig, tenant: str, result: ChatResult) -> list[str]:
    """Drop sensitive tool calls the approval callback refuses; returns the withheld call names."""
    withheld = []
    kept = []
    for call in result.tool_calls:
        if call.name not in config.sensitive_tools:
            kept.append(call)
            continue
        approved = False
        if config.approve is not None:
            verdict = config.approve(tenant, call)
            approved = bool(await verdict) if inspect.isawaitable(verdict) else bool(verdict)
        if approved:
            kept.append(call)
        else:
            withheld.append(call.name)
    if withheld:
        result.tool_calls = kept
        note = f"[taskrl: tool call(s) {', '.join(withheld)} withheld: approval required]"
        result.content = "\n".join(filter(None, [result.content, note]))
        if not kept and result.finish_reason == "tool_calls":
            result.finish_reason = "stop"
    return withheld


def _interaction(
    body: dict[str, Any],
    result: ChatResult,
    request: SamplingRequest,
    *,
    tenant: str,
    session_id: str,
    version: int,
    route: str,
    latency_ms: float,
    sampling: SamplingParams,
    shadow: bool = False,
    adapter: dict[str, Any] | None = None,
) -> Interaction:
    choice = body["choices"][0]
    message = choice.get("message") or {"role": "assistant", "content": choice.get("text", "")}  # text completions
    return Interaction(
        id=body["id"],
        tenant=tenant,
        session_id=session_id,
        model=request.model,
        policy_version=version,
        request=request.model_dump(mode="json", exclude_none=True),
        response={"message": message, "finish_reason": result.finish_reason},
        completion_token_ids=list(result.completion.token_ids),
        logprobs=list(result.completion.logprobs),
        prompt_token_ids=result.prompt_token_ids,
        tool_calls=[c.to_openai() for c in result.tool_calls],
        latency_ms=latency_ms,
        route=route,
        shadow=shadow,
        sampling=_sampling_record(sampling),
        adapter=adapter,
    )


def _sampling_record(sampling: SamplingParams) -> dict[str, Any]:
    """The effective sampling of a turn (temperature 0 = greedy), stored so training scores the row at it."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": sampling.min_p,
        "seed": sampling.seed,
        "max_new_tokens": sampling.max_new_tokens,
    }




async def _disconnect(http: fastapi.Request) -> None:
    """Returns when the client hangs up (the request body has been read; the next ASGI message is the disconnect)."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return


async def _generate(policy: Policy, plan: TurnPlan, watcher: asyncio.Task, timeout_s: float | None) -> ChatResult:
    """Sample the turn as a task; cancel it (freeing its batch row) on disconnect or past ``timeout_s``."""
    task = asyncio.ensure_future(generate_chat(policy, plan))
    try:
        done, _ = await asyncio.wait({task, watcher}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    if watcher in done:
        raise ClientGone()
    raise APIError(504, f"generation exceeded this server's {timeout_s:g}s limit per request", "server_error",
                   code="timeout")  # fmt: skip


def create_app(
    policies: dict[str, Policy],
    *,
    default_max_tokens: int | None = None,
    store: InteractionStore | None = None,
    config: ServeConfig | None = None,
) -> fastapi.FastAPI:
    """An OpenAI-compatible app serving each policy under its key as the ``model`` name.

    Each model gets a ``Router`` (versions, canary, holdout, shadow); with a ``store`` every delivered turn is
    logged (exact tokens, version, sampling, latency) before its response is sent, and feedback is accepted.
    """
    if not policies:
        raise ValueError("create_app needs at least one policy to serve")
    config = config or ServeConfig()
    max_tokens = default_max_tokens or config.default_max_tokens
    app = fastapi.FastAPI(title="taskrl", version="0.1.0")
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(CatchAll)
    app.add_middleware(CloseWhileDraining, state=app.state)
    app.add_middleware(RequestId)  # outermost: 413s and 500s carry the id too
    metrics = ServerMetrics()
    log_decision = (lambda d: store.submit("decisions", d)) if store is not None else None
    router_config = config.router
    if len(set(config.api_keys.values())) <= 1 and router_config.max_tenant_share < 1:
        from dataclasses import replace

        router_config = replace(router_config, max_tenant_share=1.0)  # one tenant: nobody to cap it against
    app.state.router_config = router_config
    app.state.routers = {
        name: Router(name, policy, router_config, on_decision=log_decision) for name, policy in policies.items()
    }
    app.state.store, app.state.config, app.state.metrics = store, config, metrics
    app.state.limiter = TenantLimiter(config.rate_limit_per_minute, config.max_concurrent_per_tenant)
    app.state.background = set()  # shadow runs in flight (kept referenced so they are not collected)
    app.state.draining = False
    app.state.in_flight = 0
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(_: fastapi.Request, exc: APIError) -> JSONResponse:
        return api_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: fastapi.Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation(list(exc.errors()))
        metrics.errors.labels("", "invalid_request").inc()  # refused before any model was resolved
        return error_response(400, message, "invalid_request_error", param=param, code="invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: fastapi.Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":  # FastAPI's words
            message = "the body could not be decoded as JSON (nested deeper than the decoder allows, or not JSON)"
            return error_response(400, message, "invalid_request_error", param="body", code="invalid_json")
        return error_response(exc.status_code, str(exc.detail), "invalid_request_error", headers=exc.headers)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness: 200 while the process serves (also while draining)."""
        routers = app.state.routers
        status = "draining" if app.state.draining else "ok"
        return {"status": status, "models": sorted(routers), "versions": {n: r.stable for n, r in routers.items()}}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 503 once draining, so a load balancer stops sending new requests."""
        if app.state.draining:
            return error_response(503, "server is draining", "server_error", code="server_draining")
        return JSONResponse({"status": "ready", "in_flight": app.state.in_flight})

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = [model_card(name, router) for name, router in app.state.routers.items()]
        return {"object": "list", "data": data}

    def model_card(name: str, router: Router) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "taskrl", "version": router.stable}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> dict[str, Any]:
        router = app.state.routers.get(model_id)
        if router is None:
            known = ", ".join(sorted(app.state.routers))
            raise APIError(404, f"The model {model_id[:256]!r} does not exist; served models: {known}",
                           param="model", code="model_not_found")  # fmt: skip
        return model_card(model_id, router)

    async def shadow_run(
        router: Router, request: SamplingRequest, tenant: str, session_id: str, endpoint: Endpoint
    ) -> None:
        version = router.shadow
        if version is None:
            return
        started = time.perf_counter()
        policy = router.policy(version)
        try:
            plan = endpoint.plan(policy, request, max_tokens, config.max_context_tokens)
            result = await asyncio.wait_for(generate_chat(policy, plan), config.generation_timeout_s)
            body = endpoint.body(result, request, policy)
            json.dumps(body, allow_nan=False)
        except (PolicyError, APIError, ValueError, TimeoutError) as exc:
            metrics.count("shadow_errors", request.model, version)
            logger.warning("shadow run of %s v%s failed: %s", request.model, version, exc)
            return
        interaction = _interaction(
            body, result, request, tenant=tenant, session_id=session_id, version=version, route="shadow",
            latency_ms=(time.perf_counter() - started) * 1000, sampling=plan.sampling, shadow=True,
            adapter=router.adapter_of(version),
        )  # fmt: skip
        if store is not None:
            try:
                await store.add("interactions", interaction)
            except StoreError as exc:
                logger.warning("shadow interaction not logged: %s", exc)
        metrics.count("shadow_requests", request.model, version)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, http: fastapi.Request) -> Any:
        return await admit(request, http, CHAT)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, http: fastapi.Request) -> Any:
        return await admit(request, http, TEXT)

    async def admit(request: SamplingRequest, http: fastapi.Request, endpoint: Endpoint) -> Any:
        if app.state.draining:
            raise APIError(503, "server is draining (shutting down); retry", "server_error", code="server_draining",
                           headers={"Retry-After": "1", "Connection": "close"})  # fmt: skip
        tenant = _chat_tenant(config, http.headers.get("authorization"))
        admission = Admission(app.state, metrics, tenant)
        response = None
        try:
            response = await serve_chat(request, http, tenant, endpoint)
            return response
        except APIError as exc:
            metrics.errors.labels(request.model, exc.code or str(exc.status)).inc()
            raise
        finally:
            if isinstance(response, ClosingStream):
                response.on_close.append(admission.close)  # held until the last chunk is sent
            else:
                admission.close()

    async def serve_chat(request: SamplingRequest, http: fastapi.Request, tenant: str, endpoint: Endpoint) -> Any:
        started = time.perf_counter()
        router = app.state.routers.get(request.model)
        if router is None:
            known = ", ".join(sorted(app.state.routers))
            raise APIError(404, f"model {request.model!r} is not served here; served models: {known}",
                           param="model", code="model_not_found")  # fmt: skip
        session_id = _session_of(http, request, config)
        version, arm = router.route(session_id)
        policy = router.policy(version)
        plan = endpoint.plan(policy, request, max_tokens, config.max_context_tokens)
        if request.stream and endpoint is CHAT and streams_tokens(policy):
            assert isinstance(request, ChatCompletionRequest)
            turn = LiveTurn(request, policy, plan, router, version, arm, tenant, session_id, started)
            headers = {"x-interaction-id": turn.id, "x-policy-version": str(version)}
            return ClosingStream(live_events(turn), media_type="text/event-stream", headers=headers)
        watcher = asyncio.ensure_future(_disconnect(http))
        try:
            policy_started = time.perf_counter()
            metrics.queue_depth.inc()
            try:
                result = await _generate(policy, plan, watcher, config.generation_timeout_s)
            except InvalidRequestError as exc:
                raise APIError(400, f"{exc}", code="invalid_request") from exc
            except PolicyError as exc:
                raise APIError(500, f"policy {request.model!r} failed: {exc}", "server_error",
                               code="policy_error") from exc  # fmt: skip
            finally:
                metrics.queue_depth.dec()
            policy_s = time.perf_counter() - policy_started
            if config.sensitive_tools and await _withhold_unapproved(config, tenant, result):
                metrics.count("withheld_tool_calls", request.model, version)
            body = endpoint.body(result, request, policy)
            try:  # rendered before anything is logged: a response that cannot be sent is never stored
                if request.stream:
                    rendered: bytes | list[str] = endpoint.events(
                        body, include_usage=request.include_usage, stops=request.client_stops()
                    )
                else:
                    rendered = json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
            except ValueError as exc:
                raise APIError(500, f"response could not be rendered: {exc}", "server_error") from exc
            logged = await log_turn(body, result, request, tenant, session_id, version, arm, policy_s, plan.sampling,
                                    router.adapter_of(version))  # fmt: skip
            delivery = Delivery(store, body["id"] if logged != "false" else None, metrics)
            if watcher.done():  # the client left while we logged: its row must not look delivered
                delivery.undelivered(request.model)
                raise ClientGone()
        except ClientGone:
            metrics.count("cancelled", request.model, version)
            return Response(status_code=499)
        finally:
            watcher.cancel()
        elapsed = served(router, request, tenant, session_id, endpoint, version, arm, result, started, policy_s)
        headers = {
            "x-interaction-id": body["id"],
            "x-policy-version": str(version),
            "x-logged": logged,
            "x-overhead-ms": f"{(elapsed - policy_s) * 1000:.3f}",  # server time beyond the policy
        }
        if isinstance(rendered, list):
            return delivery.stream(rendered, headers, request.model)
        return Response(rendered, media_type="application/json", headers=headers)

    def served(router: Router, request: SamplingRequest, tenant: str, session_id: str, endpoint: Endpoint,
               version: int, arm: str, result: ChatResult, started: float, policy_s: float) -> float:  # fmt: skip
        """Count a served turn and mirror it to the shadow version; returns the seconds it took."""
        if router.shadow is not None and router.shadow != version:
            task = asyncio.get_running_loop().create_task(shadow_run(router, request, tenant, session_id, endpoint))
            app.state.background.add(task)
            task.add_done_callback(app.state.background.discard)
        metrics.requests.labels(request.model, str(version), arm).inc()
        metrics.tokens.labels(request.model, "prompt").inc(len(result.prompt_token_ids or []))
        metrics.tokens.labels(request.model, "completion").inc(len(result.completion.token_ids))
        elapsed = time.perf_counter() - started
        metrics.request_seconds.labels(request.model).observe(elapsed)
        metrics.policy_seconds.labels(request.model).observe(policy_s)
        metrics.overhead_seconds.observe(max(0.0, elapsed - policy_s))
        return elapsed

    async def live_events(turn: LiveTurn) -> AsyncIterator[str]:
        """A chat stream sent as it is sampled: the role at once, each content delta (with its tokens' logprobs)
        as soon as it cannot be a tool call or stop string, then, once the turn is parsed and logged, the rest.
        A turn that cannot be logged or fails ends with an error event and no ``[DONE]``; one that does not reach
        the client in full is marked undelivered."""
        request, policy, plan = turn.request, turn.policy, turn.plan
        assert policy.chat_format is not None
        events = StreamEvents(turn.id, request.model, turn.created)
        content = ContentStream(policy.chat_format.decode, plan.client_stops)
        pending: list[dict[str, Any]] = []
        sent_entries, logged, finished = 0, "false", False
        tokens = policy.stream(token_ids=plan.prompt_ids, messages=plan.messages, tools=plan.tools or None,
                               sampling=plan.sampling)  # fmt: skip
        yield events.role()
        try:
            policy_started = time.perf_counter()
            completion = None
            async with asyncio.timeout(config.generation_timeout_s):
                async for item in tokens:
                    if isinstance(item, Completion):
                        completion = item
                        break
                    ids, logprobs = item
                    if request.logprobs:
                        pending += [logprob_entry(policy, t, lp) for t, lp in zip(ids, logprobs, strict=True)]
                    delta = content.push(ids)
                    if delta:
                        yield events.chunk({"content": delta}, logprobs=pending if request.logprobs else None)
                        sent_entries, pending = sent_entries + len(pending), []
            if completion is None:
                raise PolicyError("the stream ended without a completion")
            policy_s = time.perf_counter() - policy_started
            result = finish_turn(completion, plan)
            if config.sensitive_tools and await _withhold_unapproved(config, turn.tenant, result):
                metrics.count("withheld_tool_calls", request.model, turn.version)
            body = {**response_body(result, request, policy), "id": turn.id, "created": turn.created}
            ending = events.ending(body, content.sent_text, sent_entries, include_usage=request.include_usage)
            logged = await log_turn(body, result, request, turn.tenant, turn.session_id, turn.version, turn.arm,
                                    policy_s, plan.sampling, turn.router.adapter_of(turn.version))  # fmt: skip
            for event in ending:
                yield event
            finished = True
            served(turn.router, request, turn.tenant, turn.session_id, CHAT, turn.version, turn.arm, result,
                   turn.started, policy_s)  # fmt: skip
        except TimeoutError:
            yield events.error(504, f"generation exceeded this server's {config.generation_timeout_s:g}s limit per "
                               "request", code="timeout")  # fmt: skip
        except APIError as exc:
            metrics.errors.labels(request.model, exc.code or str(exc.status)).inc()
            yield events.error(exc.status, exc.message, exc.kind, exc.code)
        except InvalidRequestError as exc:
            yield events.error(400, str(exc), "invalid_request_error", "invalid_request")
        except (PolicyError, ValueError) as exc:  # ValueError: the response could not be rendered (non-finite)
            metrics.errors.labels(request.model, "policy_error").inc()
            yield events.error(500, f"policy {request.model!r} failed: {exc}", code="policy_error")
        finally:
            await tokens.aclose()  # cancels the generation when the client left mid-stream
            if not finished and logged != "false":
                Delivery(store, turn.id, metrics).undelivered(request.model)

    async def log_turn(
        body: dict[str, Any],
        result: ChatResult,
        request: SamplingRequest,
        tenant: str,
        session_id: str,
        version: int,
        arm: str,
        policy_s: float,
        sampling: SamplingParams,
        adapter: dict[str, Any] | None,
    ) -> str:
        """"true" (committed), "spooled" (database down, kept locally) or "false" (no store); else 503."""
        if store is None:
            return "false"
        interaction = _interaction(
            body, result, request, tenant=tenant, session_id=session_id, version=version, route=arm,
            latency_ms=policy_s * 1000, sampling=sampling, adapter=adapter,
        )  # fmt: skip
        try:
            status = await store.add("interactions", interaction)
        except StoreError as exc:  # fail closed: a response that cannot be recorded is not delivered
            metrics.count("store_errors", request.model, version)
            logger.error("interaction %s not logged, response refused: %s", body["id"], exc)
            raise APIError(503, "the interaction store is unavailable; the response was not delivered, retry",
                           "server_error", code="store_unavailable", headers={"Retry-After": "1"}) from exc  # fmt: skip
        if status == "spooled":
            metrics.count("spooled", request.model, version)
            return "spooled"
        return "true"

    add_deploy_routes(app)
    return app


def serve(
    policies: dict[str, Policy],
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "info",
    store: InteractionStore | None = None,
    config: ServeConfig | None = None,
) -> None:
    """Serve ``policies`` until SIGTERM (drained) or SIGINT (the ``taskrl serve`` command)."""
    app = create_app(policies, store=store, config=config)
    uv_config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_keep_alive=KEEP_ALIVE_S)
    DrainingServer(uv_config, app.state).run()

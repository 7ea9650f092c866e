"""taskrl's OpenAI-compatible server: ``/v1/chat/completions`` (tools, streaming) over routed ``Policy`` versions.

``create_app({"name": policy}, store=InteractionStore(url), config=ServeConfig(...))`` builds the FastAPI app:
each model gets a ``Router`` (canary, holdout, shadow), every served turn is logged with its exact tokens
before the response leaves, and ``admin.py`` adds feedback, adapter hot-load, router control and metrics.
``serve`` runs it with uvicorn; ``running_server(app)`` runs it on a free loopback port in a thread (tests).
Responses carry vLLM's extension fields (``token_ids``, ``prompt_token_ids``) when ``return_token_ids`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fastapi
import httpx
import uvicorn
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from taskrl.deploy.admin import ServerMetrics, add_deploy_routes
from taskrl.deploy.config import ServeConfig
from taskrl.deploy.errors import APIError, error_response
from taskrl.deploy.router import Router
from taskrl.deploy.schemas import ChatCompletionRequest
from taskrl.deploy.store import Interaction, InteractionStore, StoreError
from taskrl.deploy.streaming import sse_events
from taskrl.parsing import parse_hermes
from taskrl.policies.base import Completion, Policy, PolicyError, SamplingParams
from taskrl.types import Message, ToolCall, new_id

DEFAULT_TENANT = "default"
logger = logging.getLogger(__name__)


# -- generation -------------------------------------------------------------------------------
@dataclass
class ChatResult:
    """One served assistant turn, with the exact tokens (for interaction logging and streaming)."""

    completion: Completion
    prompt_token_ids: list[int] | None
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str
    """OpenAI's: "stop", "length" or "tool_calls"."""


async def generate_chat(
    policy: Policy, messages: list[Message], tools: list[dict[str, Any]], sampling: SamplingParams
) -> ChatResult:
    """Sample one turn from ``policy``: render and parse for token-mode policies, pass through otherwise."""
    prompt_ids: list[int] | None = None
    if policy.chat_format is not None:
        try:
            prompt_ids = policy.chat_format.prompt_ids(messages, tools or None)
        except Exception as exc:  # jinja templates raise their own types for e.g. misordered roles
            raise APIError(400, f"cannot render messages with the chat template: {exc}") from exc
        completion = await policy.generate(
            token_ids=prompt_ids, messages=messages, tools=tools or None, sampling=sampling
        )
    else:
        completion = await policy.generate(messages=messages, tools=tools or None, sampling=sampling)
    if completion.prompt_token_ids is not None:  # what the backend actually conditioned on wins
        prompt_ids = completion.prompt_token_ids
    if completion.tool_calls is not None:
        content, calls = completion.text, completion.tool_calls
    else:
        content, calls = _parse_hermes_tool_calls(completion.text)
    finish_reason = "tool_calls" if calls else "stop"
    if completion.finish_reason == "length":
        finish_reason = "length"
    return ChatResult(completion, prompt_ids, content, calls, finish_reason)


def _parse_hermes_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split Hermes ``<tool_call>`` blocks out of model text for an OpenAI ``tool_calls`` response.

    Plain answers reach the client byte for byte; a block that does not parse stays in the content so
    the client sees what the model wrote (validation against the tools is the client's job).
    """
    parsed = parse_hermes(text, id_prefix=new_id("call"))
    if not parsed.tool_calls:
        return text, []
    broken = [f"<tool_call>{c.arguments['__raw__']}</tool_call>" for c, _ in parsed.invalid if "__raw__" in c.arguments]
    return "\n".join([parsed.content, *broken]).strip(), parsed.tool_calls


def _response_body(result: ChatResult, request: ChatCompletionRequest, policy: Policy) -> dict[str, Any]:
    completion = result.completion
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = [c.to_openai() for c in result.tool_calls]
        message["content"] = result.content or None  # OpenAI sends null content beside tool calls
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": _logprobs_body(completion, policy) if request.logprobs else None,
        "finish_reason": result.finish_reason,
    }
    body: dict[str, Any] = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(result.prompt_token_ids or []),
            "completion_tokens": len(completion.token_ids),
            "total_tokens": len(result.prompt_token_ids or []) + len(completion.token_ids),
        },
    }
    if request.return_token_ids:
        choice["token_ids"] = list(completion.token_ids)
        body["prompt_token_ids"] = result.prompt_token_ids
    return body


def _logprobs_body(completion: Completion, policy: Policy) -> dict[str, Any]:
    chat_format = policy.chat_format
    entries = []
    for i, logprob in enumerate(completion.logprobs):
        token = ""
        if chat_format is not None and i < len(completion.token_ids):
            token = chat_format.decode([completion.token_ids[i]], skip_special_tokens=False)
        entries.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": entries}


# -- app --------------------------------------------------------------------------------------
class BodySizeLimit:
    """ASGI middleware: a body over ``max_bytes`` gets 413 before any handler parses it."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        declared = int(length) if length and length.isdigit() else None
        if declared is not None and declared > self.max_bytes:
            response = error_response(413, f"request body of {declared} bytes exceeds {self.max_bytes}", "too_large")
            await response(scope, receive, send)
            return
        seen = 0

        async def counted_receive() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # chunked bodies declare no length: stop reading past the limit
                raise APIError(413, f"request body exceeds {self.max_bytes} bytes", "too_large")
            return message

        await self.app(scope, counted_receive, send)


def _session_of(http: fastapi.Request, request: ChatCompletionRequest, config: ServeConfig) -> str:
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
    request: ChatCompletionRequest,
    *,
    tenant: str,
    session_id: str,
    version: int,
    route: str,
    latency_ms: float,
    shadow: bool = False,
) -> Interaction:
    message = body["choices"][0]["message"]
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
    )


def create_app(
    policies: dict[str, Policy],
    *,
    default_max_tokens: int | None = None,
    store: InteractionStore | None = None,
    config: ServeConfig | None = None,
) -> fastapi.FastAPI:
    """An OpenAI-compatible app serving each policy under its key as the ``model`` name.

    Each model gets a ``Router`` (versions, canary, holdout, shadow); with a ``store`` every served turn is
    logged (exact tokens, version, latency) before the response is returned, and feedback is accepted.
    """
    if not policies:
        raise ValueError("create_app needs at least one policy to serve")
    config = config or ServeConfig()
    max_tokens = default_max_tokens or config.default_max_tokens
    app = fastapi.FastAPI(title="taskrl", version="0.1.0")
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes)
    metrics = ServerMetrics()
    log_decision = (lambda d: store.submit("decisions", d)) if store is not None else None
    app.state.routers = {
        name: Router(name, policy, config.router, on_decision=log_decision) for name, policy in policies.items()
    }
    app.state.store, app.state.config, app.state.metrics = store, config, metrics
    app.state.background = set()  # shadow runs in flight (kept referenced so they are not collected)
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(_: fastapi.Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: fastapi.Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        return error_response(422, f"invalid request: {problems}", "invalid_request_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        routers = app.state.routers
        return {"status": "ok", "models": sorted(routers), "versions": {n: r.stable for n, r in routers.items()}}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "taskrl", "version": r.stable}
            for name, r in app.state.routers.items()
        ]
        return {"object": "list", "data": data}

    async def shadow_run(router: Router, request: ChatCompletionRequest, tenant: str, session_id: str) -> None:
        version = router.shadow
        if version is None:
            return
        messages = [m.to_message() for m in request.messages]
        started = time.perf_counter()
        try:
            sampling = request.sampling(max_tokens)
            result = await generate_chat(router.policy(version), messages, request.tool_schemas(), sampling)
        except (PolicyError, APIError) as exc:
            metrics.count("shadow_errors", request.model, version)
            logger.warning("shadow run of %s v%s failed: %s", request.model, version, exc)
            return
        body = _response_body(result, request, router.policy(version))
        interaction = _interaction(
            body,
            result,
            request,
            tenant=tenant,
            session_id=session_id,
            version=version,
            route="shadow",
            latency_ms=(time.perf_counter() - started) * 1000,
            shadow=True,
        )
        if store is not None:
            with contextlib.suppress(StoreError):
                await store.add("interactions", interaction)
        metrics.count("shadow_requests", request.model, version)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, http: fastapi.Request) -> Any:
        started = time.perf_counter()
        tenant = _chat_tenant(config, http.headers.get("authorization"))
        router = app.state.routers.get(request.model)
        if router is None:
            known = ", ".join(sorted(app.state.routers))
            raise APIError(404, f"model {request.model!r} is not served here; served models: {known}")
        session_id = _session_of(http, request, config)
        version, arm = router.route(session_id)
        policy = router.policy(version)
        messages = [m.to_message() for m in request.messages]
        policy_started = time.perf_counter()
        try:
            result = await generate_chat(policy, messages, request.tool_schemas(), request.sampling(max_tokens))
        except PolicyError as exc:
            metrics.count("errors", request.model, version)
            raise APIError(500, f"policy {request.model!r} failed: {exc}", "server_error") from exc
        policy_ms = (time.perf_counter() - policy_started) * 1000
        if config.sensitive_tools and await _withhold_unapproved(config, tenant, result):
            metrics.count("withheld_tool_calls", request.model, version)
        body = _response_body(result, request, policy)
        logged = "false"
        if store is not None:
            interaction = _interaction(
                body,
                result,
                request,
                tenant=tenant,
                session_id=session_id,
                version=version,
                route=arm,
                latency_ms=policy_ms,
            )
            try:
                await store.add("interactions", interaction)
                logged = "true"
            except StoreError as exc:  # the user still gets the answer; the gap is counted and logged
                metrics.count("store_errors", request.model, version)
                logger.error("interaction %s not logged: %s", body["id"], exc)
        if router.shadow is not None and router.shadow != version:
            task = asyncio.get_running_loop().create_task(shadow_run(router, request, tenant, session_id))
            app.state.background.add(task)
            task.add_done_callback(app.state.background.discard)
        metrics.count("requests", request.model, version, arm)
        overhead_ms = (time.perf_counter() - started) * 1000 - policy_ms
        metrics.observe_overhead(overhead_ms, policy_ms)
        headers = {
            "x-interaction-id": body["id"],
            "x-policy-version": str(version),
            "x-logged": logged,
            "x-overhead-ms": f"{overhead_ms:.3f}",  # server time beyond the policy (auth, routing, logging)
        }
        if request.stream:
            include_usage = bool((request.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                sse_events(body, include_usage=include_usage), media_type="text/event-stream", headers=headers
            )
        return JSONResponse(body, headers=headers)

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
    """Serve ``policies`` until interrupted (the ``taskrl serve`` command)."""
    uvicorn.run(create_app(policies, store=store, config=config), host=host, port=port, log_level=log_level)


# -- background server (tests, notebooks) -----------------------------------------------------
class ServerThread:
    """Runs an ASGI app with uvicorn in a daemon thread; ``start()`` returns once /health answers."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        startup_timeout_s: float = 30.0,
        log_level: str = "warning",
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        """Root URL, e.g. ``http://127.0.0.1:41234`` (``/health`` lives here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI base URL, e.g. ``http://127.0.0.1:41234/v1`` (what ``OpenAIPolicy`` takes)."""
        return self.url + "/v1"

    def start(self) -> str:
        if self._thread is not None:
            raise RuntimeError("ServerThread already started")
        # Binding here (port 0 = any free port) and handing uvicorn the socket avoids the race of
        # picking a free port and having something else take it before uvicorn binds.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((self.host, self.port))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(self.app, log_level=self.log_level, timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name=f"taskrl-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.base_url

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        last_error = "not started"
        while time.monotonic() < deadline:
            assert self._thread is not None and self._server is not None
            if not self._thread.is_alive():
                raise RuntimeError(f"server thread for {self.url} exited during startup; see its log above")
            if self._server.started:
                try:
                    status = httpx.get(self.url + "/health", timeout=2.0, trust_env=False).status_code
                except httpx.HTTPError as exc:
                    last_error = f"{type(exc).__name__}: {exc}"
                else:
                    if status == 200:
                        return
                    if status == 404:
                        raise RuntimeError(f"{self.url} has no /health route; give the app one")
                    last_error = f"/health returned HTTP {status}"
            time.sleep(0.05)
        raise TimeoutError(
            f"server at {self.url} not healthy after {self.startup_timeout_s:g}s ({last_error}); "
            "raise startup_timeout_s or check the app's startup"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True  # abandon in-flight requests rather than hang the caller
            self._thread.join(5.0)
        if self._socket is not None:
            self._socket.close()
        if self._thread.is_alive():
            raise RuntimeError(f"server thread for {self.url} did not stop within {timeout_s + 5:g}s")
        self._server = self._thread = self._socket = None

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_server(
    app: Any, host: str = "127.0.0.1", port: int = 0, *, startup_timeout_s: float = 30.0
) -> Iterator[str]:
    """Run ``app`` on loopback for the duration of the block; yields the ``/v1`` base URL."""
    server = ServerThread(app, host, port, startup_timeout_s=startup_timeout_s)
    server.start()
    try:
        yield server.base_url
    finally:
        server.stop()

"""``OpenAIPolicy``: a message-mode policy backed by any OpenAI-compatible chat server.

Works with vLLM, SGLang, llama.cpp and taskrl's own ``taskrl serve``. It asks for logprobs and, via the
vLLM extension ``return_token_ids``, for the exact sampled and prompt token ids, so rollouts stay
token-exact where the server allows it. Weight sync is a LoRA hot-load (``load_lora_adapter``)::

    policy = OpenAIPolicy("http://127.0.0.1:8000/v1", model="smollm2")
    completion = await policy.generate(messages=[Message("user", "hi")], sampling=SamplingParams())
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from taskrl.policies.base import Completion, PolicyBase, PolicyError, SamplingParams
from taskrl.types import MAX_ARGUMENT_CHARS, Message, ToolCall, bound_arguments, compact_json, new_id

# Statuses worth a retry: the server is up but momentarily failing or overloaded.
_RETRY_STATUSES = frozenset({500, 502, 503, 504})
# Transport errors (server down, restarting, connection dropped); sampling has no side effects, so a
# retry is safe.
_RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)


class OpenAIPolicy(PolicyBase):
    """Samples assistant turns from an OpenAI-compatible ``/chat/completions`` endpoint.

    ``base_url`` includes the API prefix (``http://host:port/v1``). ``version`` counts weight updates
    (LoRA loads or ``set_version``) and is stamped on every ``Completion``.
    """

    chat_format = None  # message mode: the server renders the chat template

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        name: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
        version: int = 0,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"OpenAIPolicy.timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"OpenAIPolicy.max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.version = version
        # Created on first use so the client binds to the event loop that actually runs requests.
        self._client: httpx.AsyncClient | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def set_version(self, version: int) -> None:
        """Record that the served weights now correspond to learner version ``version``."""
        self.version = int(version)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> OpenAIPolicy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- generation ----------------------------------------------------------------------------
    async def generate(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> Completion:
        """Sample one assistant turn for ``messages``; ``tools`` are OpenAI function schemas."""
        if token_ids is not None or messages is None:
            raise PolicyError(
                "OpenAIPolicy works on messages (chat_format is None): call generate(messages=...), "
                "not generate(token_ids=...)"
            )
        version = self.version  # the weights this request is sent to, even if a sync lands meanwhile
        data = await self._post("/chat/completions", self._request_body(messages, tools, sampling))
        return _parse_completion(data, version=version, url=self._url("/chat/completions"))

    def _request_body(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, sampling: SamplingParams
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.to_openai() for m in messages],
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": True,
            "return_token_ids": True,  # vLLM extension; other servers ignore unknown fields
        }
        if tools:
            body["tools"] = tools
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k  # vLLM/SGLang extension; only sent when asked for
        return body

    # -- weight sync ---------------------------------------------------------------------------
    async def load_lora_adapter(self, name: str, path: str) -> int:
        """Hot-load a LoRA adapter (vLLM's ``/v1/load_lora_adapter``) and sample from it from now on.

        Later requests use ``model=name``, as vLLM selects adapters by model name. Returns the new version.
        """
        await self._post("/load_lora_adapter", {"lora_name": name, "lora_path": path})
        self.model = name
        self.version += 1
        return self.version

    async def unload_lora_adapter(self, name: str) -> None:
        """Ask the server to drop adapter ``name`` (vLLM's ``/v1/unload_lora_adapter``); this policy is unchanged."""
        await self._post("/unload_lora_adapter", {"lora_name": name})

    # -- HTTP ----------------------------------------------------------------------------------
    def _url(self, path: str) -> str:
        return self.base_url + path

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=headers)
        return self._client

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        """POST with bounded retries on connection errors and 5xx; every failure is a PolicyError."""
        url = self._url(path)
        for attempt in range(self.max_retries + 1):
            last_try = attempt == self.max_retries
            try:
                response = await self._http().post(url, json=body)
            except _RETRY_ERRORS as exc:
                if last_try:
                    raise PolicyError(
                        f"cannot reach OpenAI-compatible server at {url} "
                        f"({type(exc).__name__}: {_one_line(str(exc))}); "
                        "start the server or pass the right --base-url"
                    ) from exc
            except httpx.TimeoutException as exc:
                # The model may still be generating: retrying would double the load, so fail now.
                raise PolicyError(
                    f"request to {url} timed out after {self.timeout_s:g}s; raise timeout_s or lower max_new_tokens"
                ) from exc
            except httpx.HTTPError as exc:
                raise PolicyError(f"request to {url} failed: {type(exc).__name__}: {exc}") from exc
            else:
                if response.status_code < 400:
                    try:
                        return response.json()
                    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the decoder
                        raise PolicyError(f"{url} returned a non-JSON body: {_one_line(response.text[:200])}") from exc
                if response.status_code not in _RETRY_STATUSES or last_try:
                    raise PolicyError(f"{url} returned HTTP {response.status_code}: {_error_message(response)}")
            await asyncio.sleep(self.retry_backoff_s * 2**attempt)
        raise AssertionError("unreachable: the retry loop always returns or raises")


def _parse_completion(data: Any, *, version: int, url: str) -> Completion:
    """Turn a chat-completion response body into a ``Completion``; never raises on bad tool args."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise PolicyError(f"{url} returned no choices[0].message: {_one_line(str(data)[:200])}") from exc
    info: dict[str, Any] = {}
    tool_calls, invalid = _parse_tool_calls(message.get("tool_calls") or [])
    if invalid:
        info["invalid_tool_call_arguments"] = invalid

    raw_finish = choice.get("finish_reason")
    if raw_finish not in (None, "stop", "length", "tool_calls"):
        info["server_finish_reason"] = raw_finish
    finish_reason = "length" if raw_finish == "length" else "stop"

    logprob_entries = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(entry["logprob"]) for entry in logprob_entries]
    token_ids = [int(t) for t in choice.get("token_ids") or []]
    if token_ids and logprobs and len(token_ids) != len(logprobs):
        raise PolicyError(
            f"{url} returned {len(token_ids)} token ids but {len(logprobs)} logprobs; "
            "the sampled tokens cannot be aligned for training"
        )
    prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    return Completion(
        text=message.get("content") or "",
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=finish_reason,
        policy_version=version,
        prompt_token_ids=[int(t) for t in prompt_ids] if prompt_ids is not None else None,
        tool_calls=tool_calls,
        info=info,
    )


def _parse_tool_calls(raw_calls: list[dict[str, Any]]) -> tuple[list[ToolCall], list[dict[str, Any]]]:
    """OpenAI ``tool_calls`` -> ToolCalls. Undecodable arguments are kept as ``{"__raw__": text}``
    and reported, so the loop can answer them with an error result instead of losing them."""
    calls: list[ToolCall] = []
    invalid: list[dict[str, Any]] = []
    for raw in raw_calls:
        function = raw.get("function") or {}
        call_id = raw.get("id") or new_id("call")
        name = function.get("name") or ""
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some servers send an object, not a JSON string
            text = compact_json(arguments, 2000)  # never str(): repr recurses as deep as the value
        else:
            text = "" if arguments is None else str(arguments)
        try:
            decoded = arguments if isinstance(arguments, dict) else json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            error = f"arguments are not valid JSON: {exc}"
        except RecursionError:  # far deeper than any real call: an error observation, not a crash
            error = "arguments are nested too deeply to decode"
        else:
            if isinstance(decoded, dict):
                bounded, problem = bound_arguments(decoded)
                calls.append(ToolCall(id=call_id, name=name, arguments=bounded))
                if problem is not None:  # kept truncated (serialisable) and reported, as the agent loop does
                    invalid.append({"call_id": call_id, "name": name, "arguments": text[:2000],
                                    "error": f"arguments {problem}"})  # fmt: skip
                continue
            error = f"arguments must be a JSON object, got {type(decoded).__name__}"
        text = text[:MAX_ARGUMENT_CHARS]
        calls.append(ToolCall(id=call_id, name=name, arguments={"__raw__": text}))
        invalid.append({"call_id": call_id, "name": name, "arguments": text, "error": error})
    return calls, invalid


def _error_message(response: httpx.Response) -> str:
    """The server's own error text: OpenAI ``{"error": {"message"}}``, FastAPI ``detail``, or the body."""
    try:
        body = response.json()
    except ValueError:
        return _one_line(response.text[:500]) or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return _one_line(str(error["message"]))
        for key in ("message", "detail", "error"):
            if body.get(key):
                return _one_line(str(body[key])[:500])
    return _one_line(str(body)[:500])


def _one_line(text: str) -> str:
    return " ".join(text.split())

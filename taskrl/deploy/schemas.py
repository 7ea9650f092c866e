"""The request schema of ``/v1/chat/completions``: the subset of OpenAI's that taskrl honours (pydantic).

Unknown fields, and known ones taskrl cannot honour, are refused by ``check_supported`` (400 naming the field);
``ChatMessageIn.to_message`` turns a wire message into a ``Message`` and ``ChatCompletionRequest.sampling`` into
``SamplingParams``. Shared by the server and the store's dataset reader.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from taskrl.deploy.errors import invalid_param
from taskrl.policies.base import SamplingParams
from taskrl.types import MAX_VALUE_DEPTH, Message, ToolCall, value_depth

MAX_ARGUMENT_DEPTH = MAX_VALUE_DEPTH // 2
"""Deepest nesting of a tool call's arguments in a request (what ``bound_arguments`` keeps from model output)."""
MAX_FIELD_DEPTH = MAX_VALUE_DEPTH
"""Deepest nesting of any request field. Deeper JSON is refused with a 400 naming the field: it would overflow
the JSON decoder's or pydantic's recursion limit later (a 500), and no real schema or argument is that deep."""


def _check_depth(value: Any, limit: int, what: str) -> Any:
    if value_depth(value, limit) > limit:
        raise ValueError(f"{what} nested deeper than {limit} levels")
    return value


# -- request schema (the subset of OpenAI's that taskrl honours; unknown fields are refused) ------
class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCallIn(BaseModel):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"

    @field_validator("arguments")
    @classmethod
    def _decode(cls, value: str | dict[str, Any]) -> dict[str, Any]:
        if isinstance(value, dict):
            return _check_depth(value, MAX_ARGUMENT_DEPTH, "tool call arguments")
        try:
            decoded = json.loads(value) if value.strip() else {}  # JSONDecodeError is a ValueError -> 400
        except RecursionError:  # the C decoder's own depth guard: far deeper than MAX_ARGUMENT_DEPTH
            raise ValueError(f"tool call arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels") from None
        if not isinstance(decoded, dict):
            raise ValueError("tool call arguments must be a JSON object")
        return _check_depth(decoded, MAX_ARGUMENT_DEPTH, "tool call arguments")


class ToolCallIn(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _check_tool_message(self) -> ChatMessageIn:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self

    def to_message(self) -> Message:
        parts = self.content if isinstance(self.content, list) else []
        content = "".join(p.text for p in parts) if parts else str(self.content or "")
        calls = [ToolCall(c.id, c.function.name, c.function.arguments) for c in self.tool_calls or []]
        # "developer" is OpenAI's newer name for the system role; chat templates only know "system".
        role = "system" if self.role == "developer" else self.role
        return Message(role, content, tool_calls=calls, tool_call_id=self.tool_call_id, name=self.name)


class FunctionDef(BaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


MIN_SAMPLING_TEMPERATURE = 1e-2
"""Temperatures in (0, this) are served greedy: logits / 1e-40 overflows to inf and samples NaN logprobs."""
MAX_SEED = 2**64 - 1
"""Seeds are 64-bit: [-2**63, 2**64 - 1] is accepted and folded into [0, 2**63) for the engine."""
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20

ToolChoice = Literal["none", "auto", "required"] | dict[str, Any]

NEUTRAL_EXTRAS: dict[str, Any] = {
    # vLLM's chat-completion extensions taskrl does not implement, each with the value that asks for nothing
    "add_generation_prompt": True, "add_special_tokens": False, "continue_final_message": False, "echo": False,
    "ignore_eos": False, "include_stop_str_in_output": False, "length_penalty": 1.0, "min_tokens": 0,
    "priority": 0, "skip_special_tokens": True, "spaces_between_special_tokens": True, "use_beam_search": False,
    "stop_token_ids": [], "bad_words": [], "include_reasoning": True, "return_token_offsets": False,
    "routed_experts_prompt_start": 0, "mm_payload": "tensors", "allowed_token_ids": None, "cache_salt": None,
    "chat_template": None, "chat_template_kwargs": None, "documents": None, "ec_transfer_params": None,
    "kv_transfer_params": None, "logprob_token_ids": None, "media_io_kwargs": None, "mm_processor_kwargs": None,
    "prompt_logprobs": None, "reasoning_effort": None, "repetition_detection": None, "request_id": None,
    "return_mm_kwargs": None, "return_prompt_text": None, "return_tokens_as_token_ids": None, "session_id": None,
    "stream_interval": None, "structured_outputs": None, "thinking_token_budget": None,
    "truncate_prompt_tokens": None, "truncation_side": None, "vllm_xargs": None, "watermarking": None,
    # OpenAI's own fields beyond the ones modelled below
    "metadata": None, "store": False, "service_tier": None, "modalities": None, "audio": None, "prediction": None,
    "web_search_options": None, "verbosity": None, "prompt_cache_key": None, "safety_identifier": None,
}  # fmt: skip
"""Request fields vLLM (or OpenAI) accepts that taskrl does not honour: sent with these values (or null) they ask
for nothing and pass; any other value is refused with a 400 naming the field. Fields in neither list are refused
as unknown, so a typo (``max_token``) or an unimplemented option is never silently ignored."""


def check_extra_fields(extra: dict[str, Any] | None) -> None:
    """Refuse (400 naming it) an unknown request field, or a known one taskrl cannot honour sent with a real value."""
    for name, value in (extra or {}).items():
        if name not in NEUTRAL_EXTRAS:
            raise invalid_param(name, "unknown parameter; taskrl serves OpenAI's fields and vLLM's top_k, min_p and "
                                "return_token_ids (remove it)", "unknown_parameter")  # fmt: skip
        neutral = NEUTRAL_EXTRAS[name]
        if value is not None and value != neutral:
            raise invalid_param(name, f"not supported by taskrl's server; omit it or send {json.dumps(neutral)}",
                                "unsupported_parameter")  # fmt: skip


class SamplingRequest(BaseModel):
    """The fields ``/v1/chat/completions`` and ``/v1/completions`` share; every numeric field is range-checked (a
    violation is a 400 naming it) and unknown fields are refused by ``check_sampling``."""

    model_config = {"allow_inf_nan": False, "extra": "allow"}  # extras are checked by ``check_extra_fields``

    model: str = Field(max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=1 << 20)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1, le=1 << 31)  # vLLM extension; -1 and 0 both disable it
    min_p: float = Field(default=0.0, ge=0, le=1)  # vLLM extension; 0 disables it
    seed: int | None = Field(default=None, ge=-(2**63), le=MAX_SEED)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)  # one choice per request; ask again for more samples
    stream: bool = False
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)  # vLLM extension
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    return_token_ids: bool = False  # vLLM extension: token_ids per choice, prompt_token_ids on top
    stream_options: dict[str, Any] | None = None
    user: str | None = Field(default=None, max_length=256)  # session id when no X-Session-Id header is sent

    @field_validator("logit_bias", "response_format", "stream_options", mode="before")
    @classmethod
    def _check_nesting(cls, value: Any) -> Any:
        return _check_depth(value, MAX_FIELD_DEPTH, "value")

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(not s or len(s) > 256 for s in stops):
            raise ValueError("stop strings must be 1-256 characters")
        return value

    def check_sampling(self) -> None:
        """Refuse (400 naming the field) unknown fields and sampling options taskrl cannot honour."""
        check_extra_fields(self.model_extra)
        penalties = {"presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty}
        for name, penalty in penalties.items():
            if penalty:
                raise invalid_param(name, "penalties are not supported (the sampler would no longer match the "
                                    "stored logprobs); omit it or send 0", "unsupported_parameter")  # fmt: skip
        if self.repetition_penalty not in (None, 1.0):
            raise invalid_param("repetition_penalty", "not supported; omit it or send 1", "unsupported_parameter")
        if self.logit_bias:
            raise invalid_param("logit_bias", "logit_bias is not supported; omit it", "unsupported_parameter")
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            message = f"type {kind!r} needs constrained decoding, which taskrl's engine lacks; only 'text' is served"
            raise invalid_param("response_format", message, "unsupported_parameter")

    def sampling(self, default_max_tokens: int, extra_stop: list[str] | None = None) -> SamplingParams:
        stop = self.client_stops()
        greedy = self.temperature < MIN_SAMPLING_TEMPERATURE
        return SamplingParams(
            max_new_tokens=self.requested_max_tokens or default_max_tokens,
            temperature=0.0 if greedy else self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            min_p=self.min_p,
            seed=None if self.seed is None else self.seed % 2**63,
            stop=stop + [s for s in extra_stop or [] if s not in stop],
        )

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def client_stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatCompletionRequest(SamplingRequest):
    """``/v1/chat/completions``'s body."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1 << 20)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    functions: list[Any] | None = None  # OpenAI's legacy tool interface: refused, pointing at ``tools``
    function_call: Any = None

    @field_validator("messages", "tools", "tool_choice", "functions", "function_call", mode="before")
    @classmethod
    def _check_chat_nesting(cls, value: Any) -> Any:
        return _check_depth(value, MAX_FIELD_DEPTH, "value")

    def check_supported(self, *, token_mode: bool, constrains: bool = False) -> None:
        """Refuse (400 naming the field) what taskrl cannot honour instead of silently ignoring it.

        ``constrains``: the backend decodes forced tool calls under a grammar (``tool_choice`` required or named)."""
        self.check_sampling()
        self.check_tool_messages()
        if self.functions is not None or self.function_call is not None:
            name = "functions" if self.functions is not None else "function_call"
            raise invalid_param(name, "the legacy function-calling interface is not supported; use tools")
        if self.top_logprobs:
            raise invalid_param("top_logprobs", "top_logprobs > 0 is not supported; set logprobs=true for the "
                                "sampled tokens' logprobs", "unsupported_parameter")  # fmt: skip
        choice = self.tool_choice
        forcing = choice == "required" or isinstance(choice, dict)
        if isinstance(choice, dict):
            function = choice.get("function") if choice.get("type") == "function" else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str) or not name:
                raise invalid_param("tool_choice", "expected {'type': 'function', 'function': {'name': ...}}")
            if name not in {t.function.name for t in self.tools or []}:
                raise invalid_param("tool_choice", f"function {name!r} is not among the request's tools")
        if forcing and not self.tools:
            raise invalid_param("tool_choice", "forcing a tool call needs tools")
        if forcing and not constrains:
            raise invalid_param("tool_choice", "this model's backend cannot constrain tool calls (taskrl's own engine "
                                "can: serve an hf policy)", "unsupported_parameter")  # fmt: skip
        if self.parallel_tool_calls is False and not token_mode:
            raise invalid_param("parallel_tool_calls", "this model's backend cannot stop after the first tool call",
                                "unsupported_parameter")  # fmt: skip

    def check_tool_messages(self) -> None:
        """A tool message must answer a call an earlier assistant message made (OpenAI answers 400 otherwise)."""
        called: set[str] = set()
        for i, message in enumerate(self.messages):
            called.update(call.id for call in message.tool_calls or [])
            if message.role == "tool" and message.tool_call_id not in called:
                known = ", ".join(sorted(called)[:5]) or "none"
                raise invalid_param(f"messages[{i}].tool_call_id", f"{message.tool_call_id[:64]!r} answers no call of "
                                    f"an earlier assistant message (calls so far: {known})")  # fmt: skip

    def forced_functions(self) -> list[str]:
        """The function names ``tool_choice`` forces a call to (one when named, every tool when required)."""
        if isinstance(self.tool_choice, dict):
            return [str(self.tool_choice["function"]["name"])]
        if self.tool_choice == "required":
            return [t.function.name for t in self.tools or []]
        return []

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_schemas(self) -> list[dict[str, Any]]:
        if self.tool_choice == "none":  # the model is not offered the tools, so it cannot call them
            return []
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

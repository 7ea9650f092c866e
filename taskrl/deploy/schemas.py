"""The request schema of ``/v1/chat/completions``: the subset of OpenAI's that taskrl honours (pydantic).

Unknown fields are ignored; ``ChatMessageIn.to_message`` turns a wire message into a ``Message`` and
``ChatCompletionRequest.sampling`` into ``SamplingParams``. Shared by the server and the store's dataset reader.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from taskrl.policies.base import SamplingParams
from taskrl.types import Message, ToolCall


# -- request schema (the subset of OpenAI's that taskrl honours; unknown fields are ignored) ------
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
            return value
        decoded = json.loads(value) if value.strip() else {}  # JSONDecodeError is a ValueError -> 422
        if not isinstance(decoded, dict):
            raise ValueError("tool call arguments must be a JSON object")
        return decoded


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


class ChatCompletionRequest(BaseModel):
    model: str
    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)  # vLLM extension; -1 and 0 both disable it
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)  # one choice per request; ask again for more samples
    stream: bool = False
    logprobs: bool = False
    return_token_ids: bool = False  # vLLM extension: token_ids per choice, prompt_token_ids on top
    stream_options: dict[str, Any] | None = None
    user: str | None = Field(default=None, max_length=256)  # session id when no X-Session-Id header is sent

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_new_tokens=self.max_completion_tokens or self.max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            seed=self.seed,
            stop=stop,
        )

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

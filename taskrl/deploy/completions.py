"""``/v1/completions``: raw text or token-id prompts, no chat template (what vLLM's token-in/token-out clients use).

``CompletionRequest`` is the body (the sampling fields are shared with chat in ``schemas.SamplingRequest``);
``plan_completion`` validates it for a token-mode policy and builds the ``TurnPlan`` the chat path samples with;
``completion_body`` and ``completion_events`` shape OpenAI's ``text_completion`` response and its stream. The
server routes, limits, samples and logs these turns exactly like chat turns (the stored row has no messages and
the prompt's exact token ids).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from pydantic import Field

from taskrl.deploy.errors import APIError, invalid_param
from taskrl.deploy.generation import ChatResult, TurnPlan, check_context, openai_body
from taskrl.deploy.schemas import MAX_TOP_LOGPROBS, SamplingRequest
from taskrl.policies.base import Policy

DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's default ``max_tokens`` for ``/v1/completions``."""


class CompletionRequest(SamplingRequest):
    """``/v1/completions``'s body: one prompt (text, or token ids as vLLM accepts), one choice."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=DEFAULT_COMPLETION_TOKENS, ge=1, le=1 << 20)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=1)

    def check_supported(self) -> None:
        self.check_sampling()
        if self.logprobs:
            raise invalid_param("logprobs", "alternatives are not computed; send logprobs=0 for the sampled tokens' "
                                "logprobs", "unsupported_parameter")  # fmt: skip
        if self.suffix:
            raise invalid_param("suffix", "insertion (a suffix) is not supported; omit it", "unsupported_parameter")

    def one_prompt(self) -> str | list[int]:
        """The prompt, unwrapped from a one-element batch (several prompts per request are refused)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise invalid_param("prompt", f"one prompt per request, got {len(prompt)}; send them separately")
            prompt = prompt[0]
        if not prompt:
            raise invalid_param("prompt", "the prompt is empty")
        return prompt  # type: ignore[return-value]


def plan_completion(
    policy: Policy, request: CompletionRequest, default_max_tokens: int, max_context: int | None = None
) -> TurnPlan:
    """Validate ``request`` for ``policy`` (400s name the field) and decide its prompt ids and sampling."""
    request.check_supported()
    chat_format = policy.chat_format
    if chat_format is None:
        raise APIError(400, f"model {request.model!r} is served through messages only; use /v1/chat/completions",
                       param="model", code="unsupported_endpoint")  # fmt: skip
    prompt = request.one_prompt()
    if isinstance(prompt, str):
        prompt_ids = chat_format.encode(prompt)
    else:
        vocab = getattr(policy, "vocab_size", None) or len(chat_format.tokenizer)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise invalid_param("prompt", f"token ids {bad[:5]} are outside the model's vocabulary (size {vocab})")
        prompt_ids = list(prompt)
    sampling = request.sampling(default_max_tokens)
    plan = TurnPlan([], [], sampling, prompt_ids=prompt_ids, client_stops=request.client_stops(), parse_tools=False)
    check_context(plan, policy, request.requested_max_tokens, max_context, param="prompt")
    return plan


def completion_body(result: ChatResult, request: CompletionRequest, policy: Policy) -> dict[str, Any]:
    completion = result.completion
    logprobs = None
    if request.logprobs is not None and policy.chat_format is not None:
        tokens = [policy.chat_format.decode([t], skip_special_tokens=False) for t in completion.token_ids]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        logprobs = {"tokens": tokens, "token_logprobs": list(completion.logprobs), "top_logprobs": None,
                    "text_offset": offsets}  # fmt: skip
    choice: dict[str, Any] = {"index": 0, "text": result.content, "logprobs": logprobs,
                              "finish_reason": result.finish_reason}  # fmt: skip
    return openai_body("text_completion", f"cmpl-{secrets.token_hex(16)}", result, request, choice)


def completion_events(body: dict[str, Any], *, include_usage: bool = False, **_: Any) -> list[str]:
    """The SSE events of a finished ``text_completion`` body: the text, the finish reason, usage, ``[DONE]``."""
    choice = body["choices"][0]
    base = {key: body[key] for key in ("id", "object", "created", "model")}
    first = {**choice, "finish_reason": None}
    last = {"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}
    events = [{**base, "choices": [first]}, {**base, "choices": [last]}]
    if include_usage:
        events.append({**base, "choices": [], "usage": body["usage"]})
    return [f"data: {json.dumps(event, allow_nan=False)}\n\n" for event in events] + ["data: [DONE]\n\n"]

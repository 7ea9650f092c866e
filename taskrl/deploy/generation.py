"""One served assistant turn: validate the request against the policy, sample it, and shape OpenAI's response.

``plan_turn`` does every check that must happen before a request joins a decode batch (supported fields,
context room, a forced tool call's token budget), so one bad request never reaches the batch its neighbours share.
``generate_chat`` samples the turn; ``finish_turn`` trims client stop strings from the returned text (the
stored tokens stay exactly what was sampled), parses tool calls and refuses non-finite logprobs.
``response_body`` is the ``chat.completion`` JSON.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from taskrl.deploy.errors import APIError, invalid_param
from taskrl.deploy.schemas import ChatCompletionRequest
from taskrl.parsing import parse_hermes
from taskrl.policies.base import Completion, Policy, PolicyBase, PolicyError, SamplingParams
from taskrl.types import Message, ToolCall

CALL_CLOSE = "</tool_call>"


def completion_id() -> str:
    """OpenAI-style response id with 128 random bits (it is also the interaction id feedback refers to)."""
    return f"chatcmpl-{secrets.token_hex(16)}"


@dataclass
class TurnPlan:
    """What ``generate_chat`` will send to the policy, decided and validated up front."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    sampling: SamplingParams
    prompt_ids: list[int] | None = None
    """Token-mode prompt."""
    client_stops: list[str] = field(default_factory=list)
    parse_tools: bool = True
    forced_call: bool = False
    """``tool_choice`` forces a call (required or named): the engine constrains the turn to one."""


@dataclass
class ChatResult:
    """One served assistant turn, with the exact tokens (for interaction logging and streaming)."""

    completion: Completion
    prompt_token_ids: list[int] | None
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str
    """OpenAI's: "stop", "length" or "tool_calls"."""


def context_limit(policy: Policy, override: int | None = None) -> int | None:
    """Tokens of context the policy's model has (prompt + completion), when known."""
    if override is not None:
        return override
    value = policy.max_positions if isinstance(policy, PolicyBase) else None  # PolicyBase declares it
    return value if isinstance(value, int) and value > 0 else None


def plan_turn(
    policy: Policy, request: ChatCompletionRequest, default_max_tokens: int, max_context: int | None = None
) -> TurnPlan:
    """Validate ``request`` for ``policy``; decide prompt and sampling (forced call names too); 400s name fields."""
    token_mode = policy.chat_format is not None
    constrains = token_mode and isinstance(policy, PolicyBase) and policy.constrains_tool_calls
    request.check_supported(token_mode=token_mode, constrains=constrains)
    messages = [m.to_message() for m in request.messages]
    tools = request.tool_schemas()
    forced_names = request.forced_functions()
    extra_stop = []
    if tools and request.parallel_tool_calls is False:
        extra_stop = [CALL_CLOSE]  # one call: the turn ends with the first call's closing tag
    sampling = request.sampling(default_max_tokens, extra_stop)
    sampling.force_tool_call = tuple(forced_names)  # the engine decodes the call under a grammar of these names
    plan = TurnPlan(messages, tools, sampling, client_stops=request.client_stops(), forced_call=bool(forced_names))
    plan.parse_tools = request.tool_choice != "none"
    if not token_mode:
        return plan
    assert policy.chat_format is not None
    try:
        prompt = policy.chat_format.prompt_ids(messages, tools or None)
    except Exception as exc:  # jinja templates raise their own types for e.g. misordered roles
        raise APIError(400, f"cannot render messages with the chat template: {exc}", param="messages") from exc
    plan.prompt_ids = prompt
    check_context(plan, policy, request.requested_max_tokens, max_context)
    needed = policy.min_tool_call_tokens(forced_names) if forced_names and isinstance(policy, PolicyBase) else 0
    if plan.sampling.max_new_tokens < needed:
        room = plan.sampling.max_new_tokens
        raise invalid_param("max_tokens", f"a forced tool call needs {needed} tokens; this turn may sample {room} "
                            "(raise max_tokens, or shorten the messages)")  # fmt: skip
    return plan


def check_context(
    plan: TurnPlan, policy: Policy, requested: int | None, max_context: int | None, param: str = "messages"
) -> None:
    """400 ``context_length_exceeded`` when the prompt leaves no room (or less than ``requested``); else cut the
    plan's token budget to the room left."""
    limit = context_limit(policy, max_context)
    if limit is None or plan.prompt_ids is None:
        return
    prompt = plan.prompt_ids
    room = limit - len(prompt)
    if room < 1 or (requested is not None and requested > room):
        completion = f"{requested} in the completion" if requested is not None else "no room for a completion"
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(prompt) + (requested or 0)} tokens ({len(prompt)} in the {param}, {completion}). "
            f"Please reduce the length of the {param} or completion.",
            param=param,
            code="context_length_exceeded",
        )
    plan.sampling.max_new_tokens = min(plan.sampling.max_new_tokens, room)


async def generate_chat(
    policy: Policy,
    messages: list[Message] | TurnPlan,
    tools: list[dict[str, Any]] | None = None,
    sampling: SamplingParams | None = None,
) -> ChatResult:
    """Sample one turn from ``policy`` (a ``TurnPlan``, or messages + tools + sampling for direct callers)."""
    if isinstance(messages, TurnPlan):
        plan = messages
    else:
        plan = TurnPlan(list(messages), list(tools or []), sampling or SamplingParams())
        if policy.chat_format is not None:
            try:
                plan.prompt_ids = policy.chat_format.prompt_ids(plan.messages, plan.tools or None)
            except Exception as exc:
                raise APIError(400, f"cannot render messages with the chat template: {exc}") from exc
    tools_arg = plan.tools or None
    if plan.prompt_ids is not None:
        completion = await policy.generate(
            token_ids=plan.prompt_ids, messages=plan.messages, tools=tools_arg, sampling=plan.sampling
        )
    else:
        completion = await policy.generate(messages=plan.messages, tools=tools_arg, sampling=plan.sampling)
    return finish_turn(completion, plan)


def trim_stops(text: str, stops: list[str]) -> tuple[str, bool]:
    """Text up to (not including) the earliest client stop string, as OpenAI and vLLM return it."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def finish_turn(completion: Completion, plan: TurnPlan) -> ChatResult:
    """Trim stop strings, parse tool calls, refuse a broken sample (non-finite logprobs)."""
    bad = [x for x in completion.logprobs if not math.isfinite(x)]
    if bad:
        raise PolicyError(
            f"the policy sampled {len(bad)} token(s) with non-finite logprobs (e.g. {bad[0]}); the turn is "
            "refused and not logged (its weights or sampling are broken)"
        )
    prompt_ids = plan.prompt_ids
    if completion.prompt_token_ids is not None:  # what the backend actually conditioned on wins
        prompt_ids = completion.prompt_token_ids
    text, stopped = trim_stops(completion.text, plan.client_stops)
    if completion.tool_calls is not None:
        content, calls = text, completion.tool_calls
    elif plan.parse_tools:
        if CALL_CLOSE in plan.sampling.stop and text.count("<tool_call>") > text.count(CALL_CLOSE):
            text += CALL_CLOSE  # the closing tag was the turn's stop string (an engine may have cut it)
        content, calls = parse_hermes_tool_calls(text)
        if plan.forced_call and not calls:  # the grammar makes this impossible: an engine bug, not the request's
            raise PolicyError(f"the constrained tool call did not parse: {text[:200]!r}")
    else:
        content, calls = text, []
    finish_reason = "tool_calls" if calls else "stop"
    if completion.finish_reason == "length" and not stopped:
        finish_reason = "length"
    return ChatResult(completion, prompt_ids, content, calls, finish_reason)


def parse_hermes_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split Hermes ``<tool_call>`` blocks out of model text for an OpenAI ``tool_calls`` response.

    Plain answers reach the client byte for byte; a block that does not parse stays in the content so
    the client sees what the model wrote (validation against the tools is the client's job).
    """
    parsed = parse_hermes(text, id_prefix=f"call_{secrets.token_hex(8)}")
    if not parsed.tool_calls:
        return text, []
    broken = [f"<tool_call>{c.arguments['__raw__']}</tool_call>" for c, _ in parsed.invalid if "__raw__" in c.arguments]
    return "\n".join([parsed.content, *broken]).strip(), parsed.tool_calls


def response_body(result: ChatResult, request: ChatCompletionRequest, policy: Policy) -> dict[str, Any]:
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
    return openai_body("chat.completion", completion_id(), result, request, choice)


def openai_body(kind: str, body_id: str, result: ChatResult, request: Any, choice: dict[str, Any]) -> dict[str, Any]:
    """The response around one ``choice``: id, object ``kind``, usage, and the exact token ids when asked for
    (``/v1/chat/completions`` and ``/v1/completions`` alike)."""
    completion = result.completion
    prompt_tokens = len(result.prompt_token_ids or [])
    body: dict[str, Any] = {
        "id": body_id,
        "object": kind,
        "created": int(time.time()),
        "model": request.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(completion.token_ids),
            "total_tokens": prompt_tokens + len(completion.token_ids),
        },
    }
    if request.return_token_ids:
        choice["token_ids"] = list(completion.token_ids)
        body["prompt_token_ids"] = result.prompt_token_ids
    return body


def _logprobs_body(completion: Completion, policy: Policy) -> dict[str, Any]:
    ids = completion.token_ids
    return {"content": [logprob_entry(policy, ids[i] if i < len(ids) else None, logprob)
                        for i, logprob in enumerate(completion.logprobs)]}  # fmt: skip


def logprob_entry(policy: Policy, token_id: int | None, logprob: float) -> dict[str, Any]:
    """One entry of OpenAI's ``logprobs.content``: the token's text, its logprob and bytes (no alternatives)."""
    token = ""
    if policy.chat_format is not None and token_id is not None:
        token = policy.chat_format.decode([token_id], skip_special_tokens=False)
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}

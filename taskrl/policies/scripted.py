"""ScriptedPolicy: deterministic rules that write assistant turns; the fake engine and the cold-start guide.

A rule maps the conversation so far to the next assistant text (tool calls in Hermes format). Without a
``chat_format`` it works in message mode; with one it also returns the exact token ids of its text plus
the end-of-turn token, each with logprob 0 (the rule is deterministic), so its episodes are token-exact
and usable for behaviour cloning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from taskrl.chat import ChatFormat, format_tool_call
from taskrl.policies.base import Completion, PolicyBase, SamplingParams
from taskrl.types import Message

Rule = Callable[[list[Message], list[dict[str, Any]] | None], str]


class ScriptedPolicy(PolicyBase):
    """Writes whatever ``rule(messages, tools)`` returns."""

    def __init__(self, rule: Rule, *, name: str = "scripted", chat_format: ChatFormat | None = None) -> None:
        self.rule = rule
        self.name = name
        self.version = 0
        self.chat_format = chat_format
        eos_id = chat_format.tokenizer.eos_token_id if chat_format else None
        self._eos = int(eos_id) if eos_id is not None else None

    @classmethod
    def from_turns(cls, turns: Sequence[str], **kwargs: Any) -> ScriptedPolicy:
        """Say ``turns[i]`` at the i-th assistant turn of every episode (the last one repeats)."""

        def rule(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
            n = sum(m.role == "assistant" for m in messages)
            return turns[min(n, len(turns) - 1)]

        return cls(rule, **kwargs)

    @staticmethod
    def call(name: str, **arguments: Any) -> str:
        """The Hermes text of one tool call, for writing rules."""
        return format_tool_call(name, arguments)

    async def generate(
        self,
        *,
        token_ids: list[int] | None = None,
        messages: list[Message] | None = None,
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams,
    ) -> Completion:
        if messages is None:
            raise ValueError("ScriptedPolicy needs the messages to apply its rule")
        text = self.rule(messages, tools)
        if self.chat_format is None:
            return Completion(text=text, policy_version=self.version)
        ids = self.chat_format.encode(text)
        finish = "length" if len(ids) >= sampling.max_new_tokens else "stop"
        if finish == "length":
            ids = ids[: sampling.max_new_tokens]
            text = self.chat_format.decode(ids)
        elif self._eos is not None:
            ids.append(self._eos)
        return Completion(
            text=text,
            token_ids=ids,
            logprobs=[0.0] * len(ids),
            finish_reason=finish,
            policy_version=self.version,
            prompt_token_ids=list(token_ids) if token_ids is not None else None,
        )

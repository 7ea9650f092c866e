"""Turn messages and tool schemas into token ids with a tokenizer's chat template, incrementally.

The agent loop renders the opening prompt once, then only ever *appends*: the forced tokens that close
a sampled assistant turn (``close_turn_ids``) and each observation (``observation_ids``), each tokenised
once. Sampled assistant tokens are never re-rendered. Templates without a tools slot (SmolLM2) get the
tool schemas in the system prompt in Hermes format, and tool results as ``<tool_response>`` user turns.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from taskrl.types import Message

if TYPE_CHECKING:  # transformers is imported by whoever built the tokenizer; envs import this module without it
    from transformers import PreTrainedTokenizerBase

HERMES_TOOL_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user query. "
    "Don't make assumptions about what values to plug into functions. Here are the available tools: "
    "<tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>'
)

_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
_SENTINEL = "\u2063TASKRL_SENTINEL\u2063"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used incrementally (renders are not prefixes)."""


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """Hermes text of one call; '<' is JSON-escaped so an argument can never close the tag early."""
    body = json.dumps({"name": name, "arguments": arguments}).replace("<", "\\u003c")
    return "<tool_call>\n" + body + "\n</tool_call>"


class ChatFormat:
    """Renders conversations for one tokenizer. Build once per tokenizer; cheap to call."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, native_tools: bool | None = None) -> None:
        from transformers import PreTrainedTokenizerFast

        if not tokenizer.chat_template:
            raise ChatTemplateError(
                "tokenizer has no chat_template; set tokenizer.chat_template to a Jinja chat template"
            )
        self.tokenizer = tokenizer
        self.native_tools = (
            "tools" in tokenizer.chat_template if native_tools is None else native_tools
        )
        self._fast = tokenizer.backend_tokenizer if isinstance(tokenizer, PreTrainedTokenizerFast) else None
        self.stop_token_ids = self._find_stop_ids()
        self._turn_suffix = self._assistant_suffix()
        self._close_cache: dict[int | None, list[int]] = {}
        self._obs_base = [Message("user", "x"), Message("assistant", "y")]
        self._obs_base_text = self.render(self._obs_base, add_generation_prompt=False)

    # -- rendering ---------------------------------------------------------------------------
    def to_template_messages(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """Messages as the template expects them; Hermes conventions when it has no tools slot."""
        if self.native_tools:
            return [self._native_dict(m) for m in messages]
        out: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "tool":
                block = f"<tool_response>\n{m.content}\n</tool_response>"
                if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool": True})
            elif m.role == "assistant" and m.tool_calls:
                calls = "\n".join(format_tool_call(c.name, c.arguments) for c in m.tool_calls)
                out.append({"role": "assistant", "content": (m.content + "\n" + calls).strip()})
            else:
                out.append({"role": m.role, "content": m.content})
        if tools:
            tool_text = HERMES_TOOL_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + tool_text}
            else:
                out.insert(0, {"role": "system", "content": tool_text})
        for d in out:
            d.pop("_tool", None)
        return out

    @staticmethod
    def _native_dict(m: Message) -> dict[str, Any]:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}, "id": c.id}
                for c in m.tool_calls
            ]
        if m.role == "tool":
            d["tool_call_id"] = m.tool_call_id
            d["name"] = m.name
        return d

    def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if self.native_tools and tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(self.to_template_messages(messages, tools), **kwargs)

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:  # the Rust tokenizer directly: ~10x less overhead than __call__
            return self._fast.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    # -- incremental token ids ---------------------------------------------------------------
    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a whole conversation, ending with the assistant generation prompt."""
        return self.encode(self.render(messages, tools))

    def close_turn_ids(self, completion_ids: list[int]) -> list[int]:
        """Forced tokens that close a sampled assistant turn the way the template closes it."""
        last = completion_ids[-1] if completion_ids and completion_ids[-1] in self.stop_token_ids else None
        if last not in self._close_cache:
            suffix = self._turn_suffix
            if last is not None:
                stop_text = self.tokenizer.decode([last], skip_special_tokens=False)
                if suffix.startswith(stop_text):
                    suffix = suffix[len(stop_text) :]
            self._close_cache[last] = self.encode(suffix) if suffix else []
        return list(self._close_cache[last])

    def observation_ids(self, new_messages: list[Message]) -> list[int]:
        """Token ids of messages appended after a closed assistant turn, plus the generation prompt."""
        full = self.render(self._obs_base + new_messages, add_generation_prompt=True)
        if not full.startswith(self._obs_base_text):
            raise ChatTemplateError(
                "chat template does not render appended messages as a suffix; taskrl needs an "
                "append-only template to stay token-exact"
            )
        return self.encode(full[len(self._obs_base_text) :])

    def _assistant_suffix(self) -> str:
        text = self.render(
            [Message("user", "x"), Message("assistant", _SENTINEL)], add_generation_prompt=False
        )
        if _SENTINEL not in text:
            raise ChatTemplateError("chat template drops assistant content; cannot find turn suffix")
        return text.split(_SENTINEL, 1)[1]

    def _find_stop_ids(self) -> set[int]:
        ids: set[int] = set()
        eos = self.tokenizer.eos_token_id
        if eos is not None:
            ids.add(int(eos))
        vocab = self.tokenizer.get_vocab()
        for tok in _END_OF_TURN_TOKENS:
            if tok in vocab:
                ids.add(int(vocab[tok]))
        return ids

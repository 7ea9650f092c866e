"""Constrained decoding of one Hermes tool call: ``<tool_call>\\n{"name": <one of the names>, "arguments": {...}}``.

``ToolCallConstraint(vocab, names)`` is a per-request automaton the sampler consults before each token
(``allowed(remaining)``: the token ids that keep the text a prefix of a valid call) and advances after it
(``advance(token)``). The name is one of the request's functions; the arguments are a compact JSON object (strings
without escapes, integers, true/false/null, nested objects and arrays); after ``</tool_call>`` only an end-of-turn
token may follow, so a forced turn is exactly one call. When the tokens left shrink to what the shortest completion
needs (tokenised greedily, longest token first), only that completion is allowed, one longest token at a time, so a
call always closes within ``max_new_tokens`` (``min_tokens`` is the budget the shortest call needs). ``Vocab`` holds
the tokenizer's per-token text and id sets, built once per tokenizer. Logprobs stay those of the unconstrained
distribution (``taskrl.policies.sampling``).
"""

from __future__ import annotations

import json
import string
import weakref
from collections import defaultdict
from typing import Any

import torch

CALL_OPEN = '<tool_call>\n{"name": '
ARGUMENTS = ', "arguments": '
CALL_CLOSE = "}\n</tool_call>"
_PLAIN = set(string.ascii_letters + string.digits + " !#$%&'()*+,-./:;<=>?@[]^_`{|}~")
"""Characters a token may hold inside a JSON string (no quote, backslash or control character)."""
_MAX_TOKEN_CHARS = 48
_MAX_GROWTH = 4
"""Most characters one token can add to the shortest completion (a comma in an object adds a key: ``"":0``)."""
_VOCABS: weakref.WeakKeyDictionary[Any, Vocab] = weakref.WeakKeyDictionary()


class Vocab:
    """Per-token text of a tokenizer and the id sets the automaton needs (``Vocab.of(tokenizer)`` caches it)."""

    def __init__(self, tokenizer: Any) -> None:
        size = len(tokenizer)
        texts = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.by_text: dict[str, list[int]] = defaultdict(list)
        plain, digits, digits_lead = [], [], []
        for i, text in enumerate(texts):
            if i in special or not text or "\ufffd" in text:
                continue
            self.by_text[text].append(i)
            if all(c in _PLAIN for c in text):
                plain.append(i)
            if text.isascii() and text.isdigit():
                digits.append(i)
                if text[0] != "0":
                    digits_lead.append(i)
        self.plain = torch.tensor(plain, dtype=torch.long)
        self.digits = torch.tensor(digits, dtype=torch.long)
        self.digits_lead = torch.tensor(digits_lead, dtype=torch.long)
        self._sets: dict[str, torch.Tensor] = {}
        self.text = texts

    @classmethod
    def of(cls, tokenizer: Any) -> Vocab:
        found = _VOCABS.get(tokenizer)
        if found is None:
            found = _VOCABS[tokenizer] = cls(tokenizer)
        return found

    def chars(self, chars: str) -> torch.Tensor:
        """Ids of the one-character tokens for ``chars``."""
        return torch.tensor([i for c in chars for i in self.by_text.get(c, [])], dtype=torch.long)

    def longest(self, text: str) -> list[int]:
        """Ids of the longest token that is a prefix of ``text`` (empty when none is)."""
        for k in range(min(len(text), _MAX_TOKEN_CHARS), 0, -1):
            found = self.by_text.get(text[:k])
            if found:
                return found
        return []

    def greedy_count(self, text: str) -> int:
        """Tokens ``text`` takes when each step takes the longest token that fits (one per character at worst)."""
        count, at = 0, 0
        while at < len(text):
            ids = self.longest(text[at:])
            at += len(self.text[ids[0]]) if ids else 1
            count += 1
        return count

    def prefixes(self, texts: list[str]) -> torch.Tensor:
        """Ids of every token whose text is a non-empty prefix of one of ``texts``."""
        ids = {i for text in texts for k in range(1, min(len(text), _MAX_TOKEN_CHARS) + 1)
               for i in self.by_text.get(text[:k], [])}  # fmt: skip
        return torch.tensor(sorted(ids), dtype=torch.long)

    def union(self, key: str, *parts: torch.Tensor) -> torch.Tensor:
        """A cached union of id sets (the per-state sets are the same for every request)."""
        found = self._sets.get(key)
        if found is None:
            found = self._sets[key] = torch.unique(torch.cat(parts))
        return found


class ToolCallConstraint:
    """The automaton of one request (see the module docstring); ``reset()`` restarts it with the request."""

    def __init__(self, vocab: Vocab, names: list[str], stop_ids: list[int]) -> None:
        if not names:
            raise ValueError("ToolCallConstraint needs at least one function name")
        self.vocab = vocab
        self.stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        """End-of-turn ids of this request (the caller's; the vocabulary is shared by every request)."""
        self.candidates = [CALL_OPEN + json.dumps(name) + ARGUMENTS for name in names]
        self.reset()

    def reset(self) -> None:
        self.alive = list(self.candidates)
        self.offset = 0
        self.phase = "head"  # head (literal with the name), json (arguments), tail (literal), done
        # json modes: open, obj_start, key, colon, value, arr_start, string, number, literal, after, next_key
        self.mode = "open"
        self.stack: list[str] = []
        self.literal = ""
        self.tail = CALL_CLOSE
        self.number = ""

    # -- the text that must follow -------------------------------------------------------------
    def closing(self) -> str:
        """The shortest text that completes a valid call from here."""
        if self.phase == "head":
            return min((c[self.offset :] for c in self.alive), key=len) + "{}" + CALL_CLOSE
        if self.phase == "tail":
            return self.tail
        if self.phase == "done":
            return ""
        head = {"open": "{}", "obj_start": "}", "key": '":0', "colon": ":0", "value": "0", "arr_start": "]",
                "string": '"', "literal": self.literal, "next_key": '"":0', "after": "",
                "number": "0" if self.number in ("", "-") else ""}[self.mode]  # fmt: skip
        stack = self.stack[:-1] if self.mode in ("obj_start", "arr_start") else self.stack
        if self.mode == "open":
            return head + CALL_CLOSE
        return head + "".join("}" if kind == "o" else "]" for kind in reversed(stack)) + CALL_CLOSE

    # -- allowed tokens ------------------------------------------------------------------------
    def allowed(self, remaining: int) -> torch.Tensor:
        """Token ids that may come next, given ``remaining`` tokens of budget (the end-of-turn token included)."""
        vocab = self.vocab
        if self.phase == "done":
            return self.stop
        closing = self.closing()
        # Close when one more free token could leave too little: it may add _MAX_GROWTH characters (a token each at
        # worst) to the closing text. The cheap character bound first; the greedy count only near the end.
        if remaining <= len(closing) + 1 + _MAX_GROWTH and remaining <= vocab.greedy_count(closing) + 1 + _MAX_GROWTH:
            return torch.tensor(vocab.longest(closing), dtype=torch.long)
        if self.phase == "head":
            return vocab.prefixes([c[self.offset :] for c in self.alive])
        if self.phase == "tail":
            return vocab.prefixes([self.tail])
        mode = self.mode
        if mode == "open":
            return vocab.chars("{")
        if mode == "obj_start":
            return vocab.chars('"}')
        if mode in ("key", "string"):
            return vocab.union("string", vocab.plain, vocab.chars('"'))
        if mode == "colon":
            return vocab.chars(":")
        if mode == "next_key":
            return vocab.chars('"')
        if mode == "literal":
            return vocab.prefixes([self.literal])
        closers = "}" if self.stack and self.stack[-1] == "o" else "]"
        if mode == "number":
            if self.number == "-":
                return vocab.union("lead", vocab.digits_lead, vocab.chars("0"))
            if self.number == "0" or self.number == "-0":
                return vocab.chars("," + closers)
            return vocab.union("number" + closers, vocab.digits, vocab.chars("," + closers))
        if mode == "after":
            return vocab.chars("," + closers)
        starts = vocab.union("value", vocab.chars('"{[-0tfn'), vocab.digits_lead)
        if mode == "arr_start":
            return vocab.union("arr_start", starts, vocab.chars("]"))
        return starts  # value

    # -- advancing -----------------------------------------------------------------------------
    def advance(self, token: int) -> None:
        """Consume the sampled ``token`` (one the automaton allowed)."""
        text = self.vocab.text[token] if 0 <= token < len(self.vocab.text) else ""
        if self.phase == "done" or not text:
            return
        for char in text:
            self._step(char)

    def _step(self, char: str) -> None:
        if self.phase == "head":
            self.alive = [c for c in self.alive if c[self.offset : self.offset + 1] == char]
            self.offset += 1
            if self.alive and self.offset == len(self.alive[0]):
                self.phase, self.mode = "json", "open"
            return
        if self.phase == "tail":
            self.tail = self.tail[1:]
            if not self.tail:
                self.phase = "done"
            return
        self._json(char)

    def _json(self, char: str) -> None:
        mode = self.mode
        if mode == "open":
            self.stack, self.mode = ["o"], "obj_start"
        elif mode in ("obj_start", "next_key") and char == '"':
            self.mode = "key"
        elif mode == "key":
            self.mode = "colon" if char == '"' else "key"
        elif mode == "colon":
            self.mode = "value"
        elif mode == "string":
            self.mode = "after" if char == '"' else "string"
        elif mode == "literal":
            self.literal = self.literal[1:]
            self.mode = "literal" if self.literal else "after"
        elif mode == "number" and (char.isdigit() or (char == "-" and not self.number)):
            self.number += char
        elif mode in ("value", "arr_start") and char not in "]":
            self._value(char)
        else:  # "after", the end of a number, an empty container: a comma or a closer
            self._close_or_next(char)

    def _value(self, char: str) -> None:
        if char == '"':
            self.mode = "string"
        elif char == "{":
            self.stack.append("o")
            self.mode = "obj_start"
        elif char == "[":
            self.stack.append("a")
            self.mode = "arr_start"
        elif char in "tfn":
            self.literal = {"t": "rue", "f": "alse", "n": "ull"}[char]
            self.mode = "literal"
        else:
            self.number, self.mode = char, "number"

    def _close_or_next(self, char: str) -> None:
        if char == ",":
            self.mode = "next_key" if self.stack[-1] == "o" else "value"
            return
        self.stack.pop()  # "}" or "]"
        self.mode = "after"
        if not self.stack:
            self.phase, self.mode = "tail", "after"


    def min_tokens(self) -> int:
        """Tokens the shortest call needs from the start, the end-of-turn token included (a budget below is refused)."""
        return self.vocab.greedy_count(self.closing()) + 1


def tool_call_constraint(tokenizer: Any, stop_ids: list[int], names: list[str]) -> ToolCallConstraint:
    """A fresh automaton for one request forcing a call to one of ``names``."""
    return ToolCallConstraint(Vocab.of(tokenizer), names, stop_ids)

"""Plain values over a pipe, for the trusted harness scripts that run inside the sandbox (no taskrl imports).

``encode`` accepts only exact built-in types (``type(x) is int``, never a subclass), so whatever a candidate
returns reaches the checker as a fresh plain value: an object with a rigged ``__eq__`` cannot cross.
``decode`` builds values back from the tagged JSON and never calls code from the other side.
"""

from __future__ import annotations

import math
from typing import Any

MAX_DEPTH = 64
MAX_ITEMS = 1_000_000


class WireError(ValueError):
    """A value that is not plain data (or too big / too deep to send)."""


def encode(value: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    budget = [MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        raise WireError("value too deep or too large")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": str(value)}
    if kind is float:
        return {"f": repr(value)} if not math.isfinite(value) else value
    if kind is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "s", frozenset: "fs"}[kind]
        items = sorted(value, key=repr) if kind in (set, frozenset) else value
        return {tag: [encode(v, depth + 1, budget) for v in items]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)] for k, v in value.items()]}
    raise WireError(f"a {kind.__module__}.{kind.__qualname__} is not a plain value (int, str, list, dict, ...)")


def decode(data: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise WireError("value too deep")
    if data is None or type(data) in (bool, str, float):
        return data
    if type(data) is int:  # JSON ints only come from "i" tags; accept them anyway
        return data
    if type(data) is not dict or len(data) != 1:
        raise WireError("malformed value")
    ((tag, body),) = data.items()
    if tag == "i":
        return int(body)
    if tag == "f":
        return float(body)
    if tag == "c":
        return complex(float(body[0]), float(body[1]))
    if tag == "b":
        return bytes.fromhex(body)
    if tag in ("l", "t", "s", "fs"):
        items = [decode(v, depth + 1) for v in body]
        return {"l": list, "t": tuple, "s": set, "fs": frozenset}[tag](items)
    if tag == "d":
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
    raise WireError(f"unknown tag {tag!r}")

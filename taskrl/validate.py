"""Field checks for config dataclasses' ``__post_init__``: one rule over several fields, each error naming its field.

Fields are passed by keyword with their values (``require("MineConfig", "must be >= 1", at_least(1),
files=self.files)``), so the attribute access is ordinary typed code and a renamed field fails at the call site
instead of hiding in a string. A leaf module: it imports nothing from taskrl.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable
from typing import Any


def require(
    owner: str, rule: str, ok: Callable[[Any], bool], /, *, error: type[Exception] = ValueError, **values: Any
) -> None:
    """Raise ``error("<owner>.<field> <rule>, got <value>")`` for the first field whose value fails ``ok``."""
    for name, value in values.items():
        if not ok(value):
            raise error(f"{owner}.{name} {rule}, got {value!r}")


def at_least(minimum: float) -> Callable[[Any], bool]:
    """``value >= minimum`` (a NaN fails)."""
    return lambda value: value >= minimum


def above(minimum: float) -> Callable[[Any], bool]:
    """``value > minimum`` (a NaN fails)."""
    return lambda value: value > minimum


def optional(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``None``, or a value that passes ``ok``."""
    return lambda value: value is None or ok(value)


def integer_at_least(minimum: int) -> Callable[[Any], bool]:
    """An ``int`` that is ``>= minimum``."""
    return lambda value: isinstance(value, int) and value >= minimum


def finite_at_least(minimum: float) -> Callable[[Any], bool]:
    """A finite ``int`` or ``float`` that is ``>= minimum``."""
    return lambda value: isinstance(value, int | float) and math.isfinite(value) and value >= minimum


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'lr'?)"`` for the closest of ``choices`` to a mistyped ``word``; "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""

"""The optional env contract by name: each entry's default, each hook's arity, and the one way to read them from
an env that may not inherit ``taskrl.env.EnvDefaults`` (a third-party env). A leaf: scoring and the loop read
the contract through it without importing the env module. ``taskrl.env`` documents each entry.
"""

from __future__ import annotations

from typing import Any

OPTIONAL_DEFAULTS: dict[str, Any] = {
    "name": "", "rubric": None, "failure_reward": 0.0, "training": True, "user_turn": None, "finalize_group": None,
    "scripted_rule": None, "set_step": None, "observe_context": None, "record_episode": None, "close": None,
}  # fmt: skip
HOOK_ARITY = {"user_turn": 1, "finalize_group": 2, "scripted_rule": 2, "set_step": 2, "observe_context": 2,
          "record_episode": 1, "close": 0}  # fmt: skip


def declared(env: Any, name: str) -> Any:
    """The env's value of one optional contract entry, or its default for an env that does not inherit
    ``EnvDefaults`` (a hook it lacks reads None). The one place the optional contract is probed."""
    if name not in OPTIONAL_DEFAULTS:
        raise ValueError(f"'{name}' is not part of the optional env contract: {', '.join(OPTIONAL_DEFAULTS)}")
    return getattr(env, name, OPTIONAL_DEFAULTS[name])


def call_hook(env: Any, name: str, *args: Any) -> Any:
    """Call the env's optional hook ``name`` if it has one (its result may be awaitable); None otherwise."""
    if name not in HOOK_ARITY:
        raise ValueError(f"'{name}' is not an optional env hook: {', '.join(HOOK_ARITY)}")
    fn = declared(env, name)
    return fn(*args) if fn is not None else None


__all__ = ["HOOK_ARITY", "OPTIONAL_DEFAULTS", "call_hook", "declared"]

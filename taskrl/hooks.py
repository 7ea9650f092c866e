"""The optional env contract by name: each entry's default, each hook's arity, and the one way to read them from
an env that may not inherit ``taskrl.env.EnvDefaults`` (a third-party env). A leaf: scoring and the loop read
the contract through it without importing the env module. ``taskrl.env`` documents each entry.
"""

from __future__ import annotations

from typing import Any

OPTIONAL_DEFAULTS: dict[str, Any] = {
    "name": "", "rubric": None, "failure_reward": 0.0, "training": True, "user_turn": None, "scripted_rule": None,
    "observe_context": None, "record_episode": None, "close": None,
}  # fmt: skip
HOOK_ARITY = {"user_turn": 1, "scripted_rule": 2, "observe_context": 2, "record_episode": 1, "close": 0}
REMOVED_HOOKS = {
    "set_step": "envs are told nothing about training: declare the schedule on the env's rubric (a weight schedule, "
                "or a DerivedTerm whose param anneals, like Context-1's beta); taskrl.scoring.score applies it at "
                "the batch's Clock",
    "finalize_group": "declare the group measurement as a group term of the env's rubric (Rubric.group_terms); "
                      "taskrl.scoring.score computes it per group of samples",
}  # fmt: skip
"""Hooks the contract no longer has, with what replaces them (``check_env`` refuses an env that defines one)."""


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


__all__ = ["HOOK_ARITY", "OPTIONAL_DEFAULTS", "REMOVED_HOOKS", "call_hook", "declared"]

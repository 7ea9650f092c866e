"""Policies: anything that samples assistant turns (see ``base.Policy``).

``make_policy`` builds one by kind name for the CLI and configs; heavy backends import lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from taskrl.policies.base import Completion, Policy, PolicyError, SamplingParams

if TYPE_CHECKING:
    from taskrl.env import Env

POLICY_KINDS = ("hf", "openai", "scripted")


def make_policy(
    kind: str,
    *,
    model: str = "smollm2",
    base_url: str | None = None,
    api_key: str | None = None,
    device: str = "auto",
    env: Env | None = None,
    timeout_s: float | None = None,
) -> Policy:
    """Build a policy: ``hf`` (in-process transformers), ``openai`` (a server; ``timeout_s`` per request, default
    120), ``scripted`` (env's rule)."""
    if kind == "hf":
        from taskrl.policies.hf import HFPolicy

        return HFPolicy.from_pretrained(model, device=device)
    if kind == "openai":
        from taskrl.policies.openai import OpenAIPolicy

        if not base_url:
            raise PolicyError("--policy openai needs --base-url, e.g. http://127.0.0.1:8000/v1")
        return OpenAIPolicy(base_url, model, api_key=api_key, **({"timeout_s": timeout_s} if timeout_s else {}))
    if kind == "scripted":
        from taskrl.policies.scripted import ScriptedPolicy

        rule = getattr(env, "scripted_rule", None)
        if rule is None:
            which = f"env '{env.name}' has" if env is not None else "no env given, so there is"
            raise PolicyError(f"{which} no scripted_rule; use --policy hf or --policy openai")
        return ScriptedPolicy(rule)
    raise PolicyError(f"unknown policy '{kind}'; choose one of: {', '.join(POLICY_KINDS)}")


__all__ = ["POLICY_KINDS", "Completion", "Policy", "PolicyError", "SamplingParams", "make_policy"]

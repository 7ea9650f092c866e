"""Policies: anything that samples assistant turns (see ``base.Policy``)."""

from taskrl.policies.base import Completion, Policy, PolicyError, SamplingParams

__all__ = ["Completion", "Policy", "PolicyError", "SamplingParams"]

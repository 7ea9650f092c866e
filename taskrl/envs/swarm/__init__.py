"""Kimi K2.5 Agent Swarm (PARL): a trainable orchestrator, frozen concurrent sub-agents, critical steps and the
annealed parallel reward. ``make("swarm", ...)`` builds ``SwarmEnv``; this package imports it lazily."""

from __future__ import annotations

from typing import Any


def make_swarm_env(**kwargs: Any) -> Any:
    """``SwarmEnv(**kwargs)``, imported on first use so ``import taskrl.envs`` stays light."""
    from taskrl.envs.swarm.env import SwarmEnv

    return SwarmEnv(**kwargs)

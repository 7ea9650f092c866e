"""Kimi K2.5 Agent Swarm (PARL): a trainable orchestrator, frozen concurrent sub-agents, critical steps and the
annealed parallel reward. ``make("swarm", ...)`` builds ``SwarmEnv`` through ``taskrl.recipes.make_swarm_env``
(which hands it its default tasks and its Ray runtime); this package imports nothing on import."""

from taskrl.moved import moved_names

__getattr__ = moved_names(__name__, {"make_swarm_env": "taskrl.recipes"})

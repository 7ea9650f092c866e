"""The env factories of the search and swarm recipes: what ``make("search")`` and ``make("swarm")`` call.

Each builds its env from ``taskrl.envs`` and hands it what lives in the layers above the envs: the default data
(``taskrl.datagen.defaults``: the stdlib corpus and its task sets, built once into the cache) when no corpus or
task file is given, and, for the swarm, the Ray sub-agent runtime (``taskrl.distributed.ray_subagents``) when
``subagent_backend="ray"``. So no env imports ``datagen`` or ``distributed``; this module imports them when called.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def make_search_env(**kwargs: Any) -> Any:
    """``SearchEnv(**kwargs)`` (keyword arguments: ``config=SearchEnvConfig(...)`` or its fields); the corpus
    "default" (the default) is the stdlib corpus with its tasks, built on first use."""
    from taskrl.envs.search.env import SearchEnv

    config = kwargs.get("config")
    if (config.corpus if config is not None else kwargs.get("corpus", "default")) == "default":
        from taskrl.datagen.defaults import ensure_default_corpus

        device = config.device if config is not None else kwargs.get("device", "auto")
        corpus = str(ensure_default_corpus(device))
        if config is not None:
            kwargs["config"] = dataclasses.replace(config, corpus=corpus)
        else:
            kwargs["corpus"] = corpus
    return SearchEnv(**kwargs)


def _ray_runtime(*args: Any, **kwargs: Any) -> Any:
    from taskrl.distributed.ray_subagents import swarm_runtime  # Ray is imported only when a swarm env uses it

    return swarm_runtime(*args, **kwargs)


def make_swarm_env(**kwargs: Any) -> Any:
    """``SwarmEnv(**kwargs)`` with its Ray runtime builder and, when no ``tasks`` are given, a wide-search set
    generated once on the default corpus (keyword arguments: ``config=SwarmEnvConfig(...)`` or its fields)."""
    from taskrl.envs.swarm.env import SwarmEnv

    config = kwargs.get("config")
    if not (config.tasks if config is not None else kwargs.get("tasks")):
        from taskrl.datagen.defaults import ensure_default_swarm_tasks

        tasks = str(ensure_default_swarm_tasks())
        if config is not None:
            kwargs["config"] = dataclasses.replace(config, tasks=tasks)
        else:
            kwargs["tasks"] = tasks
    return SwarmEnv(**kwargs, ray_runtime=_ray_runtime)

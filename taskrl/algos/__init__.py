"""RL algorithms as formulas, one file each: ``grpo``, ``ppo`` (GAE, value loss), ``cispo``, ``kimi``, ``sft``;
shared loss pieces in ``losses``; step schedules in ``schedules``; what an algorithm is to the learner in
``algorithm``. ``ALGORITHMS`` is the one table ``algo.name`` names and ``taskrl.training.learner`` looks up:
a new algorithm is a module ending in ``ALGORITHM = Algorithm(...)`` and one entry here."""

from __future__ import annotations

from taskrl.algos import cispo, grpo, kimi, ppo, sft
from taskrl.algos.algorithm import Algorithm, UnknownAlgorithmError, lookup

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (grpo.ALGORITHM, ppo.ALGORITHM, cispo.ALGORITHM,
                                                        kimi.ALGORITHM, sft.ALGORITHM)}  # fmt: skip
"""Every algorithm ``algo.name`` may name, in the order error messages list them."""


def algorithm(name: str) -> Algorithm:
    """The registered algorithm called ``name``; an unknown name raises ``UnknownAlgorithmError`` listing them."""
    return lookup(ALGORITHMS, name, field_name="algo.name")


__all__ = ["ALGORITHMS", "Algorithm", "UnknownAlgorithmError", "algorithm"]

"""What an algorithm is to the learner: an advantage function, a per-token loss and a few config bits.

Each ``algos/<name>.py`` ends with ``ALGORITHM = Algorithm(...)`` and ``taskrl.algos.ALGORITHMS`` lists them by
name; the learner looks the configured one up there and never branches on the name, so a new algorithm is one
file and one table entry. The learner fills ``TrajectoryInput`` (rewards, groups, per-token KL penalties, values)
and applies the KL options, IS truncation, entropy bonus and token normalisation around the loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from taskrl.algos.losses import Tensor


@dataclass
class TrajectoryInput:
    """One trajectory as an advantage function sees it: its sequences' sampled tokens, in order."""

    reward: float
    group_id: str | None
    sizes: list[int]
    """Sampled tokens of each of the trajectory's sequences (branches are sequences of their own)."""
    kl: list[Tensor] = field(default_factory=list)
    """Per sequence, the KL penalty per sampled token, ``kl_coef`` x k1 (k1 = log pi_old - log pi_ref; the
    learner weights it, kl="k1_reward" only; else empty): subtracted from the reward."""
    values: list[Tensor] = field(default_factory=list)
    """Per sequence, the value head's estimate per sampled token (value-head algorithms only; else empty)."""
    bootstrap_value: float = 0.0
    """V of the state after the last token of a truncated episode; 0 for a terminated one."""


@dataclass
class Advantages:
    """Per trajectory, per sequence, per-token advantages; ``None`` for a trajectory with no signal (dropped)."""

    per_token: list[list[Tensor] | None]
    returns: list[list[Tensor] | None] | None = None
    """Value targets, in the same layout (value-head algorithms only)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``charts/*`` counts of the advantage step (e.g. groups seen and dropped)."""


@dataclass
class AlgoConfig:
    """The ``[algo]`` table of a training config: ``name`` picks the algorithm, whose own dataclass (declared in
    its ``algos/<name>.py``, ``Algorithm.config``) adds its fields. Errors name ``algo.<field>``."""

    name: str = ""
    """The algorithm: a name in ``taskrl.algos.ALGORITHMS``."""


AdvantageFn = Callable[[Sequence[TrajectoryInput], Any], Advantages]
"""(trajectories, the algorithm's own config) -> advantages."""
TokenLoss = Callable[[Tensor, Tensor, Tensor, Any], tuple[Tensor, dict[str, Tensor]]]
"""(logprobs, old_logprobs, advantages, the algorithm's config) -> (per-token loss, per-token stats such as
``clipfrac``)."""
ValueLoss = Callable[[Tensor, Tensor, Tensor, Any], Tensor]
"""(values, old_values, returns, the algorithm's config) -> per-token value loss, already weighted (PPO's
``vf_coef``): the learner adds it to the loss as it is."""


@dataclass(frozen=True)
class Algorithm:
    """One entry of ``taskrl.algos.ALGORITHMS``."""

    name: str
    token_loss: TokenLoss
    advantages: AdvantageFn | None = None
    """``None``: an imitation algorithm (no advantages, no old logprobs; trains every selected sampled token)."""
    value_loss: ValueLoss | None = None
    """Set when the algorithm trains a value head (the learner then makes one and scores values before updating)."""
    min_group_size: int = 1
    """Smallest ``group_size`` the advantages need (2 for group-relative ones)."""
    config: type[AlgoConfig] = AlgoConfig
    """The algorithm's own settings (the ``[algo]`` table); its functions read these and nothing of the trainer's."""

    @property
    def imitation(self) -> bool:
        return self.advantages is None

    @property
    def value_head(self) -> bool:
        return self.value_loss is not None


class UnknownAlgorithmError(ValueError):
    """An algorithm name that is not in the table; the message lists the choices."""


def lookup(table: dict[str, Algorithm], name: str, *, field_name: str = "algo") -> Algorithm:
    """``table[name]``, or an error naming ``field_name`` and every registered algorithm."""
    if name not in table:
        raise UnknownAlgorithmError(f"{field_name} must be one of {', '.join(table)}, got {name!r}")
    return table[name]


def per_sequence(values: Tensor, sizes: Sequence[int]) -> list[Tensor]:
    """A trajectory's per-token tensor cut back into its sequences."""
    return list(values.split(list(sizes)))

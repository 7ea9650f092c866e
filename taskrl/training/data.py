"""Where a run's tasks and SFT examples come from, deterministically and resumably.

``EpochSampler`` walks the task set in a fresh seeded permutation every epoch; its only state is the position,
so a resumed run draws exactly the tasks the uninterrupted run would have. ``TaskSampler`` is the contract the
trainer reads (``sample(step, n, rng)``, ``epoch``, ``update``, ``metrics``, ``state_dict``), with defaults for all
but ``sample``; ``taskrl.training.curriculum.CurriculumSampler`` subclasses it too, so a curriculum can
replace the epoch walk.
``TrajectoryFile`` serves SFT batches from a trajectories JSONL the same way.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from taskrl.seeding import derive_seed
from taskrl.types import Task, Trajectory, read_jsonl


class TaskSampler(abc.ABC):
    """Which tasks a training step plays; subclass it and write ``sample``, override the rest as needed."""

    @abc.abstractmethod
    def sample(self, step: int, n: int, rng: random.Random) -> list[Task]:
        """``n`` tasks for ``step``; ``rng`` is seeded per step, so a resumed run draws the same tasks."""

    @property
    def epoch(self) -> int:
        """Passes completed over the task set: the epoch of the reward schedules' clock (0 without epochs)."""
        return 0

    def update(self, task_id: str, rewards: Sequence[float]) -> None:  # noqa: B027 - a default that learns nothing
        """Feed back one group's rewards for ``task_id``; by default the order learns nothing from rewards."""

    def metrics(self) -> dict[str, float]:
        """Logged with the step's metrics (``charts/*``)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint stores to resume the same draws; a stateless sampler stores nothing."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - nothing to restore by default
        """Restore ``state_dict()``'s output."""


class EpochSampler(TaskSampler):
    """Tasks in a per-epoch seeded permutation; ``epoch`` = passes completed over the task set."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("EpochSampler needs at least one task")
        self.tasks = list(tasks)
        self.seed = seed
        self.position = 0
        self._orders: dict[int, list[int]] = {}

    @property
    def epoch(self) -> int:
        return self.position // len(self.tasks)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.tasks)))
            random.Random(derive_seed(self.seed, "epoch", epoch)).shuffle(order)
            self._orders = {epoch: order}  # only the current epoch is ever needed again
        return self._orders[epoch]

    def sample(self, step: int, n: int, rng: random.Random) -> list[Task]:
        """The next ``n`` tasks (crossing into the next epoch when needed); ``step`` and ``rng`` are unused."""
        out = []
        for _ in range(n):
            epoch, index = divmod(self.position, len(self.tasks))
            out.append(self.tasks[self._order(epoch)[index]])
            self.position += 1
        return out

    def metrics(self) -> dict[str, float]:
        return {"charts/epoch": float(self.epoch)}

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - nothing to restore by default
        self.position = int(state["position"])


class TrajectoryFile:
    """SFT examples from a trajectories JSONL, served in per-epoch seeded order; state is the position."""

    def __init__(self, path: str | Path, seed: int) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"sft_data file {str(path)!r} not found; use 'expert', 'policy' or a trajectories JSONL path"
            )
        self.trajectories = read_jsonl(str(path))
        if not self.trajectories:
            raise ValueError(f"sft_data file {str(path)!r} holds no trajectories")
        self._tasks = EpochSampler([Task(id=str(i), prompt="") for i in range(len(self.trajectories))], seed)

    def take(self, n: int) -> list[Trajectory]:
        return [self.trajectories[int(t.id)] for t in self._tasks.sample(0, n, random.Random(0))]

    def state_dict(self) -> dict[str, Any]:
        return self._tasks.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - nothing to restore by default
        self._tasks.load_state_dict(state)

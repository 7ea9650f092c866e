"""TaskSampler: the contract the trainer reads from any task sampler, with its defaults."""

from __future__ import annotations

import random

import pytest

from taskrl.training.curriculum import CurriculumSampler
from taskrl.training.data import EpochSampler, TaskSampler
from taskrl.types import Task


def _tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", prompt=f"task {i}") for i in range(n)]


def test_defaults_let_a_sampler_define_only_sample() -> None:
    class First(TaskSampler):
        def sample(self, step: int, n: int, rng: random.Random) -> list[Task]:
            return _tasks(n)

    sampler = First()
    sampler.update("t0", [1.0])
    assert (sampler.epoch, sampler.metrics(), sampler.state_dict()) == (0, {}, {})
    sampler.load_state_dict({})
    with pytest.raises(TypeError, match="abstract method sample"):  # a sampler without sample cannot be built
        type("Nothing", (TaskSampler,), {})()


def test_epoch_sampler_counts_epochs_and_curriculum_has_none() -> None:
    sampler = EpochSampler(_tasks(3), seed=0)
    sampler.sample(0, 4, random.Random(0))
    assert sampler.epoch == 1 and sampler.metrics() == {"charts/epoch": 1.0}
    curriculum = CurriculumSampler(_tasks(3))
    assert isinstance(curriculum, TaskSampler) and curriculum.epoch == 0

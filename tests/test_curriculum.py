"""CurriculumSampler: phase mixes, determinism, dropping zero-variance tasks, resuming, clear errors."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskrl.training.curriculum import CurriculumExhaustedError, CurriculumSampler, Phase, _apportion
from taskrl.types import Task


def pool(per_hop: int = 10) -> list[Task]:
    return [Task(f"h{h}-{i}", "q", info={"difficulty": h}) for h in (1, 2, 3) for i in range(per_hop)]


def context1_sampler(**kwargs: object) -> CurriculumSampler:
    phases = [Phase(100, {1: 0.8, 2: 0.2}), Phase(None, {1: 0.2, 2: 0.4, 3: 0.4})]
    return CurriculumSampler(pool(), phases, **kwargs)  # type: ignore[arg-type]


def hops(tasks: list[Task]) -> Counter:
    return Counter(t.info["difficulty"] for t in tasks)


def test_phase_mix_is_exact_and_switches_at_the_boundary() -> None:
    sampler = context1_sampler()
    assert hops(sampler.sample(0, 10, random.Random(0))) == {1: 8, 2: 2}
    assert hops(sampler.sample(99, 5, random.Random(0))) == {1: 4, 2: 1}
    assert hops(sampler.sample(100, 10, random.Random(0))) == {1: 2, 2: 4, 3: 4}
    batch = sampler.sample(0, 10, random.Random(0))
    assert len({t.id for t in batch}) == 10  # no repeats while a bucket has enough tasks
    assert len(sampler.sample(500, 40, random.Random(0))) == 40  # a short bucket cycles


def test_same_seed_same_batches() -> None:
    a = [t.id for t in context1_sampler().sample(3, 12, random.Random(7))]
    b = [t.id for t in context1_sampler().sample(3, 12, random.Random(7))]
    assert a == b and a != [t.id for t in context1_sampler().sample(3, 12, random.Random(8))]


def test_zero_variance_tasks_are_dropped_and_their_share_moves() -> None:
    sampler = context1_sampler(drop_solved=True, drop_unsolved=True, patience=2)
    sampler.update("h1-0", [1.0, 1.0])
    assert not sampler.dropped
    sampler.update("h1-0", [1.0, 1.0])
    sampler.update("h3-0", [0.0, 0.0])
    sampler.update("h3-0", [0.0, 0.0])
    sampler.update("h2-0", [1.0, 0.0])  # a mixed group carries signal: kept
    sampler.update("h2-0", [1.0, 0.0])
    assert sampler.dropped == {"h1-0": "solved", "h3-0": "unsolved"}
    assert sampler.metrics() == {
        "curriculum/active_tasks": 28.0, "curriculum/dropped_solved": 1.0, "curriculum/dropped_unsolved": 1.0,
    }  # fmt: skip
    for step in (0, 200):
        assert not {"h1-0", "h3-0"} & {t.id for t in sampler.sample(step, 30, random.Random(1))}
    for i in range(1, 10):  # drop every remaining one-hop task: phase 1 now samples two-hop only
        sampler.update(f"h1-{i}", [1.0])
        sampler.update(f"h1-{i}", [1.0])
    assert hops(sampler.sample(0, 10, random.Random(0))) == {2: 10}


def test_everything_dropped_is_a_clear_error_and_state_resumes() -> None:
    sampler = CurriculumSampler(pool(1), drop_solved=True)
    state_before = sampler.state_dict()
    for task in sampler.tasks:
        sampler.update(task.id, [1.0, 1.0])
    with pytest.raises(CurriculumExhaustedError, match="all 3 tasks were dropped .3 solved"):
        sampler.sample(0, 4, random.Random(0))
    resumed = CurriculumSampler(pool(1), drop_solved=True)
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.dropped == sampler.dropped
    resumed.load_state_dict(state_before)
    assert len(resumed.sample(0, 3, random.Random(0))) == 3


def test_bad_curricula_fail_at_start_naming_the_field() -> None:
    with pytest.raises(ValueError, match="no info\\['difficulty'\\]"):
        CurriculumSampler([Task("a", "q")], [Phase(None, {1: 1.0})])
    with pytest.raises(ValueError, match=r"phases\[0\].mix names difficulties no task has: \[7\]"):
        CurriculumSampler(pool(), [Phase(None, {7: 1.0})])
    with pytest.raises(ValueError, match="only the last phase"):
        CurriculumSampler(pool(), [Phase(None, {1: 1.0}), Phase(None, {2: 1.0})])
    with pytest.raises(ValueError, match="Phase.mix"):
        Phase(None, {1: 0.0})
    with pytest.raises(ValueError, match="unsolved_at"):
        CurriculumSampler(pool(), unsolved_at=1.0)
    with pytest.raises(KeyError, match="unknown task id"):
        CurriculumSampler(pool()).update("nope", [1.0])


@given(st.dictionaries(st.integers(0, 5), st.floats(0.01, 10.0), min_size=1), st.integers(0, 200))
def test_apportion_sums_exactly_and_stays_within_one_of_the_quota(ratios: dict[int, float], n: int) -> None:
    counts = _apportion(ratios, n)
    total = sum(ratios.values())
    assert sum(counts.values()) == n
    assert all(abs(counts[d] - n * r / total) < 1 + 1e-9 for d, r in ratios.items())

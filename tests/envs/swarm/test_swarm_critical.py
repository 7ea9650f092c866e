from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskrl.envs.swarm.critical import critical_members, critical_steps, total_steps

turns_st = st.lists(st.lists(st.integers(0, 50), max_size=8), min_size=1, max_size=10)


def test_golden_values() -> None:
    # turn 1 launches sub-agents of 3, 5 and 2 steps; turn 2 launches none; turn 3 the answer: (1+5) + 1 + 1
    assert critical_steps([[3, 5, 2], [], []]) == 8
    assert total_steps([[3, 5, 2], [], []]) == 13
    assert critical_members([[3, 5, 2], [], [4, 4]]) == [1, None, 0]


def test_splitting_the_longest_branch_lowers_critical_steps() -> None:
    before = critical_steps([[10, 4], []])
    assert critical_steps([[5, 5, 4], []]) < before


def test_adding_a_shorter_subagent_does_not_change_critical_steps() -> None:
    assert critical_steps([[10, 4, 9], []]) == critical_steps([[10, 4], []])


def test_bad_counts_fail_naming_the_turn() -> None:
    with pytest.raises(ValueError, match="turn 1"):
        critical_steps([[1], [-1]])


@given(turns_st)
def test_critical_between_turns_and_total(turns: list[list[int]]) -> None:
    crit = critical_steps(turns)
    assert len(turns) <= crit <= total_steps(turns)
    serial = [[s] for turn in turns for s in turn] + [[] for turn in turns if not turn]
    assert crit <= critical_steps(serial) or not any(turns)

"""Batching: sequences keep only trainable tokens, micro-batches respect the budget and cover every token once,
shared prefixes are found; the epoch sampler is deterministic and resumable."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.training.batching import (
    MIN_SHARED_PREFIX,
    collate,
    micro_batch_cost,
    plan_micro_batches,
    plan_step,
    prefix_length,
    sequences_from,
)
from taskrl.training.data import EpochSampler
from taskrl.types import Segment, Task, Trajectory

PROMPT = list(range(100, 100 + 2 * MIN_SHARED_PREFIX))


def _traj(prompt: list[int], answer: list[int], observation: list[int] = (), more: list[int] = ()) -> Trajectory:
    seg = Segment()
    seg.append(prompt, sampled=False)
    seg.append(answer, sampled=True, logprobs=[-0.5] * len(answer))
    if observation:
        seg.append(list(observation), sampled=False)
        seg.append(list(more), sampled=True, logprobs=[-0.25] * len(more))
    return Trajectory(segments=[seg])


def test_sequences_keep_sampled_positions_and_logprobs() -> None:
    trajectories = [_traj(PROMPT, [1, 2], [7, 7, 7], [3]), Trajectory(segments=[Segment([5], [0.0], [0])])]
    (seq,) = sequences_from(trajectories)
    n = len(PROMPT)
    assert seq.sampled_positions == [n, n + 1, n + 5]
    assert seq.sampler_logprobs.tolist() == [-0.5, -0.5, -0.25] and seq.traj_index == 0


def test_group_shares_its_prompt_once() -> None:
    sequences = sequences_from([_traj(PROMPT, [1, 2, 3]), _traj(PROMPT, [4]), _traj(PROMPT, [5, 6])])
    assert prefix_length(sequences) == len(PROMPT) - 1  # the last prompt token's state predicts the answer
    batch = collate(sequences, pad_id=0)
    assert batch.prefix_ids is not None and batch.prefix_ids.tolist() == PROMPT[:-1]
    assert batch.input_ids.tolist() == [[PROMPT[-1], 1, 2, 3], [PROMPT[-1], 4, 0, 0], [PROMPT[-1], 5, 6, 0]]
    assert batch.targets.tolist() == [1, 2, 3, 4, 5, 6] and batch.columns.tolist() == [0, 1, 2, 0, 0, 1]
    assert batch.position_ids[0].tolist() == list(range(len(PROMPT) - 1, len(PROMPT) + 3))
    assert batch.attention_mask[1].tolist() == [1] * len(PROMPT) + [1, 0, 0]
    assert micro_batch_cost(sequences) == len(PROMPT) - 1 + 3 * 4 == batch.computed_tokens
    different = sequences_from([_traj(PROMPT, [1]), _traj([9] + PROMPT[1:], [1])])
    assert prefix_length(different) == 0 and collate(different, pad_id=0).prefix_ids is None


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12)), min_size=1, max_size=12),
    st.integers(1, 200),
)
def test_micro_batches_cover_every_token_once_within_budget(shape: list[tuple[int, int]], budget: int) -> None:
    prompts = [PROMPT, PROMPT[:-3] + [1, 2, 3], [50] * MIN_SHARED_PREFIX]
    sequences = sequences_from([_traj(prompts[p], list(range(1, n + 1))) for p, n in shape])
    plan = plan_micro_batches(sequences, budget)
    assert sorted(i for batch in plan for i in batch) == list(range(len(sequences)))
    for batch in plan:
        members = [sequences[i] for i in batch]
        assert len(batch) == 1 or micro_batch_cost(members) <= budget
        assert len(collate(members, pad_id=0).targets) == sum(s.num_sampled for s in members)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 40)), min_size=2, max_size=16), st.integers(1, 300))
def test_step_plan_covers_every_sequence_once_within_budget(shape: list[tuple[int, int]], budget: int) -> None:
    prompts = [PROMPT + [1, 2], PROMPT + [3, 4]]  # two groups: the step shares PROMPT
    sequences = sequences_from([_traj(prompts[p], list(range(1, n + 1))) for p, n in shape])
    prefix, plan = plan_step(sequences, budget)
    assert sorted(i for batch in plan for i in batch) == list(range(len(sequences)))
    for batch in plan:
        members = [sequences[i] for i in batch]
        if prefix:
            widest = max(len(s.token_ids) for s in members) - prefix
            assert len(batch) == 1 or len(batch) * widest <= budget
            collated = collate(members, pad_id=0, step_prefix=prefix)
            assert collated.computed_tokens == len(batch) * widest
            assert collated.prefix_ids.tolist() == sequences[0].token_ids[:prefix] and prefix >= len(PROMPT)
        else:
            assert len(batch) == 1 or micro_batch_cost(members) <= budget


def test_step_plan_runs_the_shared_prompt_once_unless_groups_own_long_prompts() -> None:
    # A step prefix: two groups whose prompts differ only at the end, lengths spread out (outliers run alone).
    lengths = [2, 3, 3, 4, 30, 60]
    sequences = sequences_from([_traj(PROMPT + [g], list(range(1, n + 1))) for g in (1, 2) for n in lengths])
    prefix, plan = plan_step(sequences, 4096)
    assert prefix == len(PROMPT)
    per_batch = sum(micro_batch_cost([sequences[i] for i in b]) for b in plan_micro_batches(sequences, 4096))
    step = prefix + sum(len(b) * (max(len(sequences[i].token_ids) for i in b) - prefix) for b in plan)
    assert step < per_batch
    # Each group's own 200-token prompt: sharing per micro-batch wins, the step shares too little.
    owned = sequences_from([_traj(PROMPT + [g] * 200, list(range(1, n + 1))) for g in (1, 2) for n in (2, 3)])
    assert plan_step(owned, 4096)[0] == 0
    with pytest.raises(ValueError, match="step_prefix"):
        collate(owned, pad_id=0, step_prefix=len(PROMPT) + 5)


def test_epoch_sampler_is_deterministic_resumable_and_covers_each_epoch() -> None:
    tasks = [Task(f"t{i}", "") for i in range(5)]
    sampler = EpochSampler(tasks, seed=1)
    first = [t.id for t in sampler.sample(0, 7, random.Random(0))]
    assert sorted(first[:5]) == [t.id for t in tasks] and sampler.epoch == 1
    state = sampler.state_dict()
    rest = [t.id for t in sampler.sample(1, 6, random.Random(0))]
    resumed = EpochSampler(tasks, seed=1)
    resumed.load_state_dict(state)
    assert [t.id for t in resumed.sample(1, 6, random.Random(0))] == rest
    assert sorted(first[5:] + rest[:3]) == [t.id for t in tasks]
    assert [t.id for t in EpochSampler(tasks, seed=2).sample(0, 5, random.Random(0))] != first[:5]

"""``reverse_text`` (issue 40): prime-rl's LCS-ratio reward, tags required, splits disjoint by construction, the
expert's reversal scores 1, and the registered env passes check_env."""

from __future__ import annotations

import pytest

from taskrl.env import check_env, make
from taskrl.envs.reverse_text import (
    ReverseTextEnv,
    expert_rule,
    held_out_split,
    make_reverse_tasks,
    parse_answer,
    similarity,
)  # fmt: skip
from taskrl.types import Message, Trajectory


def _score(env: ReverseTextEnv, task_index: int, answer: str) -> float:
    task = env.tasks("test")[task_index]
    env.reset(task)
    traj = Trajectory(task_id=task.id, messages=[Message("user", task.prompt), Message("assistant", answer)])
    traj.info["final_answer"] = answer
    return env.reward(traj)["similarity"]


def test_reward_is_prime_rls_lcs_ratio_of_the_tagged_answer() -> None:
    assert similarity("abcd", "abcd") == 1.0 and similarity("", "abcd") == 0.0
    assert similarity("abxd", "abcd") == pytest.approx(0.75)  # 2 * 3 matches / 8 characters (difflib ratio)
    assert parse_answer("think <reversed_text> dcba </reversed_text>") == "dcba"
    assert parse_answer("dcba") == "" and parse_answer(None) == ""
    env = ReverseTextEnv(num_held_out=4)
    gold = env.tasks("test")[0].info["reversed"]
    assert _score(env, 0, f"<reversed_text>{gold}</reversed_text>") == 1.0
    assert _score(env, 0, gold) == 0.0  # untagged: prime-rl's parser finds no answer
    assert 0.0 < _score(env, 0, f"<reversed_text>{gold[:-1]}</reversed_text>") < 1.0


def test_splits_are_disjoint_by_construction_and_deterministic() -> None:
    train, test, val = (make_reverse_tasks(n, split) for n, split in ((2000, "train"), (200, "test"), (200, "val")))
    prompts = [{t.prompt for t in tasks} for tasks in (train, test, val)]
    assert len(prompts[0]) == 2000 and len(prompts[1]) == 200  # distinct strings
    assert not prompts[0] & prompts[1] and not prompts[0] & prompts[2] and not prompts[1] & prompts[2]
    assert all(held_out_split(t.prompt) == "test" for t in test)
    assert [t.prompt for t in make_reverse_tasks(200, "test")] == [t.prompt for t in test]
    assert all(5 <= len(t.prompt) <= 10 and t.prompt.isalpha() and t.prompt.islower() for t in train)
    words = make_reverse_tasks(5, "train", min_chars=3, max_chars=4, words=3)
    assert all(len(t.prompt.split(" ")) == 3 for t in words)
    with pytest.raises(ValueError, match="min_chars <= max_chars"):
        ReverseTextEnv(min_chars=6, max_chars=5)


def test_the_expert_reverses_and_the_registered_env_checks() -> None:
    messages = [Message("system", "s"), Message("user", "hello")]
    assert expert_rule(messages, None) == "<reversed_text>olleh</reversed_text>"
    env = make("reverse_text", num_tasks=8)
    check_env(env)
    assert env.tools.names == [] or not list(env.tools.names)

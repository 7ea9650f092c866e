"""Acceptance: a multi-turn HFPolicy episode is token-exact and its stored logprobs are recomputable."""

from __future__ import annotations

import os
from typing import Any

import pytest

from taskrl.env import ToolEnv, make
from taskrl.policies.base import Completion, SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.rollout import RolloutConfig, run_episode, run_episodes
from taskrl.types import Message, Task


class Recorder:
    """Wraps a policy and keeps every (prompt ids, completion) pair it produced."""

    def __init__(self, inner: HFPolicy) -> None:
        self.inner = inner
        self.name, self.version, self.chat_format = inner.name, inner.version, inner.chat_format
        self.turns: list[tuple[list[int], Completion]] = []

    async def generate(self, **kwargs: Any) -> Completion:
        completion = await self.inner.generate(**kwargs)
        self.turns.append((list(kwargs["token_ids"]), completion))
        return completion


class ThreeTurnChat(ToolEnv):
    """A simulated user answers twice with a long-ish observation, then the episode ends."""

    name = "three_turn_chat"

    def __init__(self) -> None:
        super().__init__()
        self.replies = 0

    def user_turn(self, text: str):  # type: ignore[no-untyped-def]
        self.replies += 1
        reply = Message("user", f"Reply {self.replies}: tell me more about tokens, please. Ünïcødé ✓")
        return [reply], self.replies >= 3, False, {}


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    model, tokenizer = tiny_model(seed=3)
    return HFPolicy(model, tokenizer, device="cpu")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_multi_turn_episode_is_token_exact(policy: HFPolicy, temperature: float) -> None:
    recorder = Recorder(policy)
    env = ThreeTurnChat()
    # Stop strings end turns early without an end-of-turn token, so closing tokens are forced (mask 0).
    sampling = SamplingParams(max_new_tokens=16, temperature=temperature, stop=["e", "a", " "])
    config = RolloutConfig(max_turns=6, sampling=sampling)
    traj = await run_episode(env, recorder, Task("t", "Hello there."), config, seed=11)

    assert traj.error is None and traj.terminated, traj.info
    assert len(recorder.turns) == 3 and len(traj.segments) == 1
    seg = traj.segments[0]
    fmt = policy.chat_format

    messages, _ = ThreeTurnChat().reset(Task("t", "Hello there."))
    expected = fmt.prompt_ids(messages, env.tools.schemas())
    expected_mask = [0] * len(expected)
    observations = [m for m in traj.messages if m.role == "user"][1:]
    for i, (prompt, completion) in enumerate(recorder.turns):
        assert prompt == expected, f"turn {i} prompt differs from the running context"
        expected += completion.token_ids
        expected_mask += [1] * len(completion.token_ids)
        if i + 1 < len(recorder.turns):
            forced = fmt.close_turn_ids(completion.token_ids) + fmt.observation_ids([observations[i]])
            expected += forced
            expected_mask += [0] * len(forced)
    assert seg.token_ids == expected, "segment != sampled tokens + tokenised observations"
    assert seg.loss_mask == expected_mask

    # The stored sampler logprobs equal a fresh full-sequence forward pass with the same weights.
    recomputed = policy.logprobs_of(seg.token_ids, temperature=temperature)
    sampled = [i for i, m in enumerate(seg.loss_mask) if m]
    assert sampled, "the policy sampled nothing"
    worst = max(abs(recomputed[i] - seg.logprobs[i]) for i in sampled)
    assert worst < 1e-4, f"stored logprobs drift from a recompute by {worst}"
    assert all(seg.logprobs[i] == 0.0 for i, m in enumerate(seg.loss_mask) if not m)


async def test_concurrent_episodes_batch_and_stay_exact(policy: HFPolicy) -> None:
    """Several episodes share the batched decoder; each one's logprobs still match its own recompute."""
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, stop=["e", " "])
    tasks = [Task(f"t{i}", f"Question number {i}?") for i in range(3)]
    trajs = await run_episodes(ThreeTurnChat, policy, tasks, RolloutConfig(sampling=sampling, group_size=2))
    assert len(trajs) == 6
    for traj in trajs:
        seg = traj.segments[0]
        recomputed = policy.logprobs_of(seg.token_ids, temperature=1.0)
        worst = max(abs(recomputed[i] - seg.logprobs[i]) for i, m in enumerate(seg.loss_mask) if m)
        assert worst < 1e-4


@pytest.mark.smollm
async def test_smollm2_plays_the_shop_env_token_exactly() -> None:
    """The real model on the built-in env: episodes finish, and every segment is recomputable."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    smol = HFPolicy.from_pretrained("smollm2", device="cpu")
    env = make("shop")
    config = RolloutConfig(max_turns=3, sampling=SamplingParams(max_new_tokens=64, temperature=0.7))
    trajs = await run_episodes(lambda: make("shop"), smol, env.tasks()[:2], config)
    assert all(t.error is None and t.segments for t in trajs)
    for traj in trajs:
        for seg in traj.segments:
            recomputed = smol.logprobs_of(seg.token_ids, temperature=0.7)
            worst = max(abs(recomputed[i] - seg.logprobs[i]) for i, m in enumerate(seg.loss_mask) if m)
            assert worst < 1e-4

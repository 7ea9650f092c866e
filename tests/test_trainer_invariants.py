"""Learner invariants on a tiny model: first ratio 1, micro-batching equivalence, frozen weights, masked tokens,
exact prefix sharing, and stale samples dropped."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import torch

import taskrl.training.batching as batching
from taskrl.env import make
from taskrl.policies.base import SamplingParams
from taskrl.policies.hf import HFPolicy
from taskrl.policies.models import tiny_model
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.training.batching import collate, sequences_from
from taskrl.training.config import TrainConfig, config_from_dict
from taskrl.training.learner import Learner
from taskrl.training.model import StepPrefix, forward, prepare_model
from taskrl.types import Trajectory

BASE = config_from_dict({"lr": 1e-3, "max_grad_norm": 0.0, "rollout.temperature": 1.0, "progress": False})


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_model(seed=0)


def _policy(tiny: tuple[Any, Any]) -> HFPolicy:
    model, tokenizer = tiny
    return HFPolicy(copy.deepcopy(model), tokenizer, device="cpu")


def _sampled(policy: Any, n_tasks: int = 2, group: int = 4, seed: int = 0) -> list[Trajectory]:
    """Real episodes of the price env, with rewards that vary inside each group."""
    tasks = list(make("price").tasks())[:n_tasks]
    config = RolloutConfig(max_turns=1, sampling=SamplingParams(max_new_tokens=6), group_size=group, seed=seed)
    trajectories = asyncio.run(run_episodes(lambda: make("price"), policy, tasks, config))
    for i, t in enumerate(trajectories):
        t.rewards["synthetic"] = float(i % 3)
    return trajectories


def _expert(policy: Any) -> list[Trajectory]:
    """Token-exact expert episodes: prompt, call, tool output (mask 0), answer."""
    env = make("price")
    expert = ScriptedPolicy(env.scripted_rule, chat_format=policy.chat_format)
    config = RolloutConfig(max_turns=3, sampling=SamplingParams(max_new_tokens=64))
    return asyncio.run(run_episodes(lambda: make("price"), expert, list(env.tasks())[:3], config))


def _learner(policy: HFPolicy, config: TrainConfig) -> Learner:
    policy.model = prepare_model(policy.model, config)
    return Learner(policy.model, config, pad_id=0)


def _capture_grads(learner: Learner) -> list[list[torch.Tensor]]:
    """Record the gradients at each optimizer step (the step itself still runs)."""
    captured: list[list[torch.Tensor]] = []
    step = learner.optimizer.step

    def spy(*args: Any, **kwargs: Any) -> Any:
        captured.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in learner.params])
        return step(*args, **kwargs)

    learner.optimizer.step = spy  # type: ignore[method-assign]
    return captured


def test_first_update_ratio_is_one_and_sampler_logprobs_match(tiny: tuple[Any, Any]) -> None:
    policy = _policy(tiny)
    trajectories = _sampled(policy)
    learner = _learner(policy, BASE.override({"finetune": "full"}))
    batch = collate(sequences_from(trajectories), pad_id=0)
    with torch.no_grad():
        learner_logprobs = forward(policy.model, batch).logprobs
    sampler = torch.cat([torch.tensor([s.logprobs[i] for i, m in enumerate(s.loss_mask) if m])
                         for t in trajectories for s in t.segments])  # fmt: skip
    assert torch.allclose(learner_logprobs, sampler, atol=1e-4)
    metrics = learner.update(trajectories, step=0)
    assert metrics["losses/ratio"] == 1.0 and metrics["losses/approx_kl"] == 0.0 and metrics["losses/clipfrac"] == 0.0
    assert metrics["losses/is_weight"] == pytest.approx(1.0, abs=1e-4)
    # with a scoring pass before the update (PPO), old logprobs come from a separate forward: still ratio 1
    ppo = _learner(_policy(tiny), BASE.override({"algo.name": "ppo", "finetune": "full"}))
    metrics = ppo.update(trajectories, step=0)
    assert metrics["losses/ratio"] == pytest.approx(1.0, abs=1e-6) and metrics["losses/clipfrac"] == 0.0


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_micro_batch_1_x_accumulation_8_equals_8_x_1(tiny: tuple[Any, Any], algo: str) -> None:
    trajectories = _sampled(_policy(tiny), n_tasks=2, group=4)
    grads = []
    for budget in (100_000, 1):  # one micro-batch of 8 sequences, then 8 micro-batches of 1
        learner = _learner(_policy(tiny), BASE.override({"algo.name": algo, "finetune": "full",
                                                         "micro_batch_tokens": budget}))
        captured = _capture_grads(learner)
        metrics = learner.update(trajectories, step=0)
        assert len(captured) == 1 and metrics["charts/trained_trajectories"] == 8
        grads.append(captured[0])
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in grads[0])


def test_shared_prefix_forward_is_exact(tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    policy = _policy(tiny)
    sequences = sequences_from(_sampled(policy))
    results = []
    for minimum in (batching.MIN_SHARED_PREFIX, 10**9):  # with, then without the shared prefix
        monkeypatch.setattr(batching, "MIN_SHARED_PREFIX", minimum)
        batch = collate(sequences, pad_id=0)
        assert (batch.prefix_ids is not None) == (minimum < 10**9)
        policy.model.zero_grad()
        logprobs = forward(policy.model, batch).logprobs
        logprobs.sum().backward()
        results.append((logprobs.detach(), [p.grad.clone() for p in policy.model.parameters()]))
    (lp_a, grads_a), (lp_b, grads_b) = results
    assert torch.allclose(lp_a, lp_b, atol=1e-5)
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_step_prefix_gradient_equals_plain_rows(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, finetune: str
) -> None:
    """One prompt pass per optimizer step (StepPrefix, several micro-batches, LoRA, checkpointing) gives the
    gradient of every row run whole, and computes fewer tokens."""
    trajectories = _sampled(_policy(tiny), n_tasks=2, group=4)
    runs = {}
    for mode in ("plain", "step_prefix", "step_prefix_checkpointed"):
        config = BASE.override({"finetune": finetune, "micro_batch_tokens": 40,
                                "gradient_checkpointing": mode.endswith("checkpointed")})  # fmt: skip
        torch.manual_seed(0)  # the same LoRA initialisation in every mode
        learner = _learner(_policy(tiny), config)
        if finetune == "lora":  # a non-zero adapter, so the prefix's K/V depend on what trains
            for name, param in learner.model.named_parameters():
                if "lora_B" in name:
                    torch.nn.init.normal_(param, std=0.05, generator=torch.Generator().manual_seed(len(name)))
        monkeypatch.setattr(batching, "MIN_SHARED_PREFIX", 10**9 if mode == "plain" else 8)
        backward_calls = []
        monkeypatch.setattr(StepPrefix, "backward", _counting(StepPrefix.backward, backward_calls))
        captured = _capture_grads(learner)
        metrics = learner.update(trajectories, step=0)
        assert (len(backward_calls) > 0) == (mode != "plain")
        runs[mode] = (captured[0], metrics["charts/forward_tokens"])
    plain_grads, plain_tokens = runs["plain"]
    assert any(g.abs().sum() > 0 for g in plain_grads)
    for mode in ("step_prefix", "step_prefix_checkpointed"):
        grads, tokens = runs[mode]
        assert tokens < plain_tokens
        for a, b in zip(grads, plain_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def _counting(method: Any, calls: list[int]) -> Any:
    def wrapper(self: Any) -> None:
        calls.append(1)
        method(self)

    return wrapper


def test_frozen_parameters_do_not_change(tiny: tuple[Any, Any]) -> None:
    trajectories = _sampled(_policy(tiny))
    lora_policy = _policy(tiny)
    learner = _learner(lora_policy, BASE.override({"finetune": "lora", "lr": 1e-2}))
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    learner.update(trajectories, step=0)
    after = dict(learner.model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all("lora_" in n for n in changed)
    assert all(after[n].requires_grad == ("lora_" in n) for n in before)

    full = _learner(_policy(tiny), BASE.override({"finetune": "full", "lr": 1e-2, "freeze": [r"layers\.0\."]}))
    before = {n: p.detach().clone() for n, p in full.model.named_parameters()}
    full.update(trajectories, step=0)
    for name, param in full.model.named_parameters():
        assert torch.equal(before[name], param) == ("layers.0." in name), name


def test_only_sampled_tokens_get_gradient(tiny: tuple[Any, Any]) -> None:
    """The learner's SFT gradient equals a full-sequence reference that masks tool output and prompt tokens,
    and differs from one that does not (so masked tokens would have contributed)."""
    policy = _policy(tiny)
    trajectories = _expert(policy)
    assert all(t.reward == 1.0 and t.metrics["tool_calls"] == 1 for t in trajectories)
    learner = _learner(policy, BASE.override({"algo.name": "sft", "finetune": "full", "sft_min_reward": 1.0}))
    captured = _capture_grads(learner)
    reference = {}
    for masked in (True, False):
        policy.model.zero_grad()
        total = sum(t.num_sampled_tokens for t in trajectories)
        loss = torch.zeros(())
        for t in trajectories:
            for seg in t.segments:
                ids = torch.tensor([seg.token_ids])
                logp = torch.log_softmax(policy.model(input_ids=ids).logits[0, :-1].float(), -1)
                picked = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
                mask = torch.tensor(seg.loss_mask[1:], dtype=torch.float32) if masked else torch.ones(len(picked))
                loss = loss - (picked * mask).sum() / total
        loss.backward()
        reference[masked] = [p.grad.clone() for p in learner.params]
    learner.update(trajectories, step=0)
    for got, want in zip(captured[0], reference[True], strict=True):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(reference[True], reference[False], strict=True))


def test_stale_and_untrainable_samples_are_dropped(tiny: tuple[Any, Any]) -> None:
    policy = _policy(tiny)
    trajectories = _sampled(policy)
    learner = _learner(policy, BASE.override({"finetune": "full", "rollout.max_staleness": 1}))
    learner.version = 5
    for t in trajectories[:4]:  # the first group is 5 versions old, the second 1
        for seg in t.segments:
            seg.policy_version = 0
    for t in trajectories[4:]:
        for seg in t.segments:
            seg.policy_version = 4
    trajectories[5].trainable = False
    metrics = learner.update(trajectories, step=0)
    assert metrics["charts/stale_dropped"] == 4 and metrics["charts/untrainable"] == 1
    assert metrics["charts/trained_trajectories"] == 3 and learner.version == 6


def test_zero_variance_groups_train_nothing(tiny: tuple[Any, Any]) -> None:
    policy = _policy(tiny)
    trajectories = _sampled(policy)
    for t in trajectories:
        t.rewards = {"flat": 1.0}
    learner = _learner(policy, BASE.override({"finetune": "full"}))
    before = [p.detach().clone() for p in learner.params]
    metrics = learner.update(trajectories, step=0)
    assert metrics["charts/dropped_groups"] == 2 and metrics["charts/trained_tokens"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, learner.params, strict=True))


@pytest.mark.parametrize(
    ("algo", "kl"), [("cispo", "none"), ("kimi", "k3_loss"), ("grpo", "k1_reward"), ("ppo", "k1_reward")]
)
def test_every_algorithm_updates_with_several_minibatches(tiny: tuple[Any, Any], algo: str, kl: str) -> None:
    policy = _policy(tiny)
    trajectories = _sampled(policy)
    config = BASE.override({"algo.name": algo, "kl": kl, "kl_coef": 0.1, "finetune": "lora", "lr": 1e-2,
                            "minibatches": 2, "epochs_per_batch": 2})
    learner = _learner(policy, config)
    captured = _capture_grads(learner)
    metrics = learner.update(trajectories, step=0)
    assert len(captured) == 4  # 2 epochs x 2 minibatches
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
    assert metrics["losses/approx_kl"] > 0  # later minibatches see a moved policy
    if kl != "none":
        assert "losses/kl_ref" in metrics

"""Ray rollout workers on a real local Ray (2 CPUs): same episodes as the in-process loop, weight pushes with
versions, a killed actor restarted, a crashing one reported, and a 2-step Trainer run with ray=true."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

ray = pytest.importorskip("ray")

from typer.testing import CliRunner  # noqa: E402

from taskrl.cli import app  # noqa: E402
from taskrl.distributed.ray_rollout import (  # noqa: E402
    RayRollout,
    RolloutActor,
    RolloutWorkerError,
    hf_rollout_policy,
    parameter_sums,
)
from taskrl.env import make  # noqa: E402
from taskrl.envs.builtin import PriceEnv  # noqa: E402
from taskrl.policies.base import PolicyError, SamplingParams  # noqa: E402
from taskrl.policies.models import tiny_model  # noqa: E402
from taskrl.policies.scripted import ScriptedPolicy  # noqa: E402
from taskrl.rollout import RolloutConfig, derive_seed, run_episodes  # noqa: E402
from taskrl.runlog import read_metrics, read_trajectories  # noqa: E402
from taskrl.training.config import ConfigError, TrainConfig, config_from_dict  # noqa: E402
from taskrl.training.learner import Learner  # noqa: E402
from taskrl.training.trainer import Trainer  # noqa: E402
from taskrl.types import Trajectory  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test envs below travel to the actors
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random model saved like any local model, so the actors can build it from TrainConfig.model."""
    path = tmp_path_factory.mktemp("tiny_model")
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return str(path)


def config_for(model_dir: str, tmp_path: Path, **changes: Any) -> TrainConfig:
    # Full fine-tuning of the embeddings keeps peft out of the actors (seconds each on a loaded machine); the
    # LoRA set-up is checked in-process below, with the same worker class.
    base = {"run_dir": str(tmp_path / "run"), "model": model_dir, "device": "cpu", "env": "price",
            "finetune": "full", "freeze": ["layers",
                                           "norm"], "lora.rank": 4, "rollout.tasks_per_step": 3,
                                           "rollout.group_size": 2,
            "rollout.max_turns": 2, "rollout.max_new_tokens": 12, "rollout.temperature": 1.0, "placement.ray": True,
            "placement.ray_workers": 2,
            "placement.ray_num_cpus_per_worker": 0.5, "sft_min_reward": 0.0, "sft_lr": 1e-2,
            "progress": False}  # fmt: skip
    return config_from_dict({**{**base, **changes}})


def rollout_config(config: TrainConfig, step: int) -> RolloutConfig:
    sampling = SamplingParams(max_new_tokens=config.rollout.max_new_tokens, temperature=config.rollout.temperature)
    return RolloutConfig(max_turns=config.rollout.max_turns, max_context_tokens=config.rollout.max_context_tokens,
                         sampling=sampling,
                         group_size=config.rollout.group_size, seed=derive_seed(config.seed, "rollout",
                                                                                step))  # fmt: skip


def exact(trajectories: list[Trajectory]) -> list[Any]:
    """What must be identical between two runs of the same episodes (ids are random; logprobs are floats)."""
    return [
        (t.task_id, t.group_id, t.seed, [m.content for m in t.messages], t.rewards,
         [(s.token_ids, s.loss_mask, s.policy_version) for s in t.segments])
        for t in trajectories
    ]  # fmt: skip


def max_logprob_gap(a: list[Trajectory], b: list[Trajectory]) -> float:
    pairs = [(x, y) for ta, tb in zip(a, b, strict=True) for sa, sb in zip(ta.segments, tb.segments, strict=True)
             for x, y in zip(sa.logprobs, sb.logprobs, strict=True)]  # fmt: skip
    return max(abs(x - y) for x, y in pairs)


@pytest.fixture(scope="module")
def trainer(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trainer]:
    """One Trainer with ray=true for the module: its actors serve the equality checks, then it trains 2 steps."""
    config = config_for(model_dir, tmp_path_factory.mktemp("run"), steps=2, sft_warmup_steps=1,
                        **{"rollout.tasks_per_step": 2},
                        checkpoint_every=1)  # fmt: skip
    trainer = Trainer(config)
    yield trainer
    trainer.close()


def test_ray_collect_equals_local_collect_token_for_token(trainer: Trainer) -> None:
    config, rollout, learner = trainer.config, trainer.ray_rollout, trainer.learner
    local = trainer.learner_policy  # holds the learner's model: the weights the actors must reproduce
    assert isinstance(rollout, RayRollout) and rollout.version == learner.version == 0  # pushed at start
    tasks = list(make("price").tasks("train"))[:3]
    settings = rollout_config(config, step=0)
    assert [len(share) for share in rollout.shares(tasks)] == [2, 1]  # groups are dealt whole
    expected = asyncio.run(run_episodes(lambda: make("price"), local, tasks, settings))
    got = rollout.collect(tasks, settings, step=0)
    assert len(got) == len(tasks) * config.rollout.group_size
    assert exact(got) == exact(expected)  # same order, same seeds, same sampled tokens at temperature 1
    assert max_logprob_gap(got, expected) < 1e-4
    assert all(s.num_sampled > 0 for t in got for s in t.segments)

    # A learner update, pushed once through the object store: the actors sample the new weights, new version.
    before = got
    learner.update(expected, step=0, sft_mode=True)
    assert learner.version == 1
    trainer.weight_sync(learner.version)
    assert rollout.version == 1 and local.version == 1
    after = rollout.collect(tasks, settings, step=0)  # same seeds as `before`: only the weights changed
    assert {s.policy_version for t in after for s in t.segments} == {1}
    assert exact(after) != exact(before) or max_logprob_gap(after, before) > 1e-4
    reference = asyncio.run(run_episodes(lambda: make("price"), local, tasks, settings))
    assert exact(after) == exact(reference)
    for traj in after[:2]:  # the sampler's logprobs are the updated local model's, token by token
        segment = traj.segments[0]
        scored = local.logprobs_of(segment.token_ids, temperature=config.rollout.temperature)
        sampled = [(x, y) for x, y, m in zip(segment.logprobs, scored, segment.loss_mask, strict=True) if m]
        assert max(abs(x - y) for x, y in sampled) < 1e-4

    # A killed actor is restarted with the current weights and its share is played again.
    ray.kill(rollout.actors[0], no_restart=True)
    again = rollout.collect(tasks, settings, step=0)
    assert rollout.restarts == 1
    assert exact(again) == exact(after)


def test_two_step_trainer_run_on_ray_workers_checkpoints(trainer: Trainer) -> None:
    start_version = trainer.learner.version  # the test above updated the learner once
    rows = trainer.train()
    assert [r["charts/phase"] for r in rows] == ["sft", "grpo"]
    run = Path(trainer.config.run_dir)
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert (run / "checkpoints" / "latest").read_text() == "step_000002"
    assert (run / "policy" / "config.json").exists()
    ray_step = read_trajectories(run)[2]  # played by the actors after the SFT update
    assert len(ray_step) == 4 and {s.policy_version for t in ray_step for s in t.segments} == {start_version + 1}


def test_lora_adapters_load_by_name_into_a_worker_built_from_the_config(model_dir: str, tmp_path: Path) -> None:
    config = config_for(model_dir, tmp_path, finetune="lora", freeze=[])
    learner_policy = hf_rollout_policy(config)  # what the trainer builds: same file, same LoRA set-up
    worker = RolloutActor(0, functools.partial(hf_rollout_policy, config), functools.partial(make, "price"))
    assert asyncio.run(worker.ready()) == parameter_sums(learner_policy.model)  # frozen base: identical
    learner = Learner(learner_policy.model, config)
    played = asyncio.run(run_episodes(lambda: make("price"), learner_policy, list(make("price").tasks())[:1],
                                      rollout_config(config, step=0)))  # fmt: skip
    learner.update(played, step=0, sft_mode=True)
    state = learner.trainable_state()
    assert state and all(".lora_" in name for name in state)
    assert asyncio.run(worker.load_weights(state, learner.version)) == 1 and worker.policy.version == 1
    mine = dict(worker.policy.model.named_parameters())
    assert all(torch.equal(mine[name], tensor) for name, tensor in state.items())
    with pytest.raises(ValueError, match="rollout worker 0: pushed weights do not fit"):
        asyncio.run(worker.load_weights({"nope": torch.zeros(1)}, 2))
    learner_policy.close()
    worker.policy.close()


def crash_rule(messages: Any, tools: Any) -> str:
    text = messages[-1].content
    if "Crash" in text:
        os._exit(3)  # the worker process dies (an OOM kill, a segfault in a native library)
    if "Bad" in text:
        raise PolicyError("the policy refused this prompt")
    return "ANSWER: 0"


def crashing_env() -> PriceEnv:
    return PriceEnv()


def test_a_worker_that_dies_twice_or_fails_is_reported_with_its_tasks(model_dir: str, tmp_path: Path) -> None:
    from taskrl.types import Task

    config = config_for(model_dir, tmp_path, **{"placement.ray_workers": 1})
    rollout = RayRollout(config, env_factory=crashing_env, policy_factory=functools.partial(ScriptedPolicy, crash_rule))
    settings = rollout_config(config, step=0)
    try:
        fine = rollout.collect([Task("ok-1", "What is 1 + 1?")], settings, step=0)
        assert len(fine) == 2 and fine[0].info["final_answer"] == "ANSWER: 0"
        with pytest.raises(RolloutWorkerError, match=r"worker 0 died twice playing tasks \['ok-2', 'crash-1'\]"):
            rollout.collect([Task("ok-2", "Fine."), Task("crash-1", "Crash now.")], settings, step=3)
        assert rollout.restarts == 1
        with pytest.raises(RolloutWorkerError, match=r"worker 0 failed playing tasks \['bad-1'\].*refused"):
            rollout.collect([Task("bad-1", "Bad prompt.")], settings, step=4)
        assert rollout.restarts == 2  # the dead worker was replaced before this step: errors are not retried
    finally:
        rollout.close()


def test_cli_flags_and_lazy_import(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--ray-address", "nonsense", "--set", f"run_dir={tmp_path}"])
    assert isinstance(result.exception, ConfigError) and "placement.ray_address" in str(result.exception)
    code = ("import sys, taskrl, taskrl.training.config, taskrl.distributed.ray_rollout, "
            "taskrl.distributed.ray_subagents; assert 'ray' not in sys.modules, 'ray imported eagerly'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ray_actors_sample_from_a_server_and_follow_its_adapters(
    model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rollout_policy=server with ray=true: the actors are OpenAIPolicy clients of a real `taskrl serve`; after an
    update the adapter is pushed once and every actor switches to it, so their samples carry the new version."""
    from taskrl.deploy.config import ServeConfig
    from taskrl.deploy.server import ServerThread, create_app
    from taskrl.policies.hf import HFPolicy

    served = HFPolicy.from_pretrained(model_dir, device="cpu")
    server = ServerThread(create_app({"tiny": served}, config=ServeConfig(admin_keys=("admin",))))
    server.start()
    monkeypatch.setenv("TASKRL_ROLLOUT_API_KEY", "admin")
    placed = {"placement.rollout_policy": "server", "placement.rollout_url": server.base_url,
              "placement.rollout_model": "tiny", "rollout.tasks_per_step": 2, "rollout.max_new_tokens": 6}
    config = config_for(model_dir, tmp_path, finetune="lora", freeze=[], steps=2, sft_warmup_steps=1,
                        checkpoint_every=0, **placed)  # fmt: skip
    trainer = Trainer(config)
    try:
        trainer.train()
        sync = trainer.weight_sync.local  # the server push; RaySync then points the actors at its adapter
        trajectories = read_trajectories(Path(config.run_dir))
        assert {s.policy_version for t in trajectories[1] for s in t.segments} == {0}  # SFT step: the base model
        assert {s.policy_version for t in trajectories[2] for s in t.segments} == {1}  # played by the actors
        version = trainer.learner.version  # 1, or 2 when step 2's groups had a reward spread to learn from
        assert version >= 1 and trainer.ray_rollout.version == version
        assert trainer.policy.model == sync.adapter_name(version)
        served_ids = {m["id"] for m in httpx.get(server.base_url + "/models", trust_env=False).json()["data"]}
        assert served_ids == {"tiny"} | {sync.adapter_name(v) for v in range(1, version + 1)}
        # the actors' step-2 requests went to the server, to adapter v1 (the SFT step was played by the expert)
        metrics = httpx.get(server.url + "/metrics", trust_env=False).text
        assert f'taskrl_requests_total{{model="{sync.adapter_name(1)}"' in metrics, metrics
    finally:
        trainer.close()
        server.stop()
        served.close()


def test_ray_actors_sample_from_the_trainers_vllm(tmp_path: Path, vllm_server: Any) -> None:
    """rollout_policy=vllm with ray=true: the actors are token-mode VLLMPolicy clients of the trainer's vLLM (the
    session's server); after an update the trainer hot-loads the adapter once and every actor switches to it."""
    config = config_from_dict({"run_dir": str(tmp_path / "run"), "model": "smollm2", "env": "price", "lora.rank": 4,
                               "lr": 1e-3, "steps": 2, "rollout.tasks_per_step": 2, "rollout.group_size": 2,
                               "rollout.max_turns": 1, "rollout.max_new_tokens": 8, "placement.ray": True,
                               "placement.ray_workers": 2, "placement.ray_num_cpus_per_worker": 0.5,
                               "placement.rollout_policy": "vllm", "checkpoint_every": 0,
                               "progress": False})  # fmt: skip

    def spread(step: int, trajectories: list[Trajectory]) -> None:  # a reward spread: every step updates
        for i, t in enumerate(trajectories):
            t.terms["spread"] = 0.25 * (i % 2)

    trainer = Trainer(config, rollout_server=vllm_server, score_fn=spread)
    try:
        trainer.train()
        trajectories = read_trajectories(Path(config.run_dir))
        for step, version in ((1, 0), (2, 1)):
            assert len(trajectories[step]) == 4
            for t in trajectories[step]:
                assert t.error is None and t.trainable and t.num_sampled_tokens > 0
                assert {s.policy_version for s in t.segments if s.num_sampled} == {version}
        assert trainer.learner.version == 2 and trainer.ray_rollout.version == 2
        served = {m["id"] for m in httpx.get(vllm_server.base_url + "/models", trust_env=False).json()["data"]}
        assert trainer.policy.model in served and trainer.policy.model.endswith("-v2")
    finally:
        trainer.close()
    assert vllm_server.alive()  # the trainer leaves a server it did not start running

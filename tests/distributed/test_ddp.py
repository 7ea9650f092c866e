"""The data-parallel learner on 2 gloo processes over loopback: a 2-rank update equals the 1-process update on the
same trajectories (full and LoRA, uneven and empty shares, several optimizer steps), desynced weights are caught,
the ranks of `taskrl train --nproc 2` resume a checkpoint, play exactly one process's tasks, log once per step from
rank 0 and end with equal weights; a failing rank stops the group; a bad nproc fails at start."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from taskrl.distributed.ddp import DataParallel, DesyncError, DistributedError, spawn, weights_digest
from taskrl.distributed.launch import train_rank
from taskrl.env import make
from taskrl.policies.models import tiny_model
from taskrl.rollout import derive_seed
from taskrl.runlog import read_metrics, read_trajectories
from taskrl.training.config import TrainConfig, config_from_dict
from taskrl.training.data import EpochSampler
from taskrl.training.learner import Learner
from taskrl.training.model import prepare_model
from taskrl.training.trainer import train
from taskrl.types import Segment, Trajectory

BASE = config_from_dict(
    {"lr": 1e-4, "max_grad_norm": 0.5, "rollout.temperature": 1.0, "progress": False, "rollout.group_size": 3}
)

CASES: list[tuple[dict[str, Any], int]] = [
    # (config changes, trajectories on rank 0; rank 1 gets the rest). 9 trajectories = 3 groups of 3.
    ({"finetune": "full", "epochs_per_batch": 2, "minibatches": 2}, 6),  # uneven tokens, 4 global optimizer steps
    ({"finetune": "lora", "lora.rank": 4, "epochs_per_batch": 2, "kl": "k1_reward", "kl_coef": 0.1}, 3),
    ({"finetune": "full", "algo.name": "ppo"}, 9),  # value head and GAE; rank 1 has nothing, yet joins every collective
]


def _learner(config: TrainConfig) -> Learner:
    """A learner on the saved tiny model (loading it needs no tokenizer: seconds saved in every rank)."""
    model = AutoModelForCausalLM.from_pretrained(config.model)
    torch.manual_seed(1)  # LoRA init; rank 0's is broadcast anyway
    group = DataParallel.from_process_group()
    return Learner(prepare_model(model, config), config, pad_id=0, data_parallel=group)


def _update(config: TrainConfig, trajectories: list[Trajectory]) -> dict[str, Any]:
    """One update; returns the weights after it, the gradient of every optimizer step, and the metrics."""
    learner = _learner(config)
    learner.group.broadcast_(learner.trainable_state())
    grads: list[list[np.ndarray]] = []
    step = learner.optimizer.step

    def spy(*args: Any, **kwargs: Any) -> Any:  # the all-reduced (and clipped) gradient the optimizer sees
        grads.append([p.grad.numpy().copy() if p.grad is not None else np.zeros(0) for p in learner.params])
        return step(*args, **kwargs)

    learner.optimizer.step = spy  # type: ignore[method-assign]
    metrics = learner.update(trajectories, step=0)
    weights = {k: v.numpy().copy() for k, v in learner.trainable_state().items()}
    return {"weights": weights, "grads": grads, "metrics": metrics}


def _rank_main(trajectories: list[Trajectory], config: TrainConfig) -> dict[str, Any]:
    """Each of the 2 ranks: every update case on its share, a deliberate desync, then ``launch``'s training run."""
    group = DataParallel.from_process_group()
    results = []
    for changes, split in CASES:
        own = trajectories[:split] if group.rank == 0 else trajectories[split:]
        results.append(_update(BASE.override({"model": config.model, **changes}), own))
    learner = _learner(BASE.override({"model": config.model, "finetune": "lora", "lora.rank": 4}))
    group.broadcast_(learner.trainable_state())
    group.check_in_sync(learner.trainable_state(), "after broadcast")  # passes
    if group.rank == 1:
        with torch.no_grad():
            next(iter(learner.trainable_state().values())).add_(1e-6)
    try:
        group.check_in_sync(learner.trainable_state(), "probe")
        desync = ""
    except DesyncError as e:
        desync = str(e)
    return {"rank": group.rank, "cases": results, "desync": desync, "run": train_rank(config)}


@pytest.fixture(scope="module")
def trajectories() -> list[Trajectory]:
    """3 groups of 3 fixed episodes: a shared prompt, then answers of different lengths around a tool output
    (mask 0); sampler logprobs near the tiny model's (about -10.8), so some importance weights hit the cap."""
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(n)]

    def logprobs(n: int) -> list[float]:
        return [-10.8 + rng.uniform(-0.8, 0.8) for _ in range(n)]

    out = []
    for g in range(3):
        prompt = ids(24)
        for k in range(3):
            segment = Segment()
            segment.append(prompt, sampled=False)
            answer, call = 3 + 4 * g + 2 * k, 2 + k
            segment.append(ids(answer), sampled=True, logprobs=logprobs(answer))
            segment.append(ids(6), sampled=False)
            segment.append(ids(call), sampled=True, logprobs=logprobs(call))
            rewards: dict[str, float | None] = {"score": float((g * 3 + k) * 7 % 4)}
            out.append(Trajectory(task_id=f"t{g}", group_id=f"t{g}#0", segments=[segment], rewards=rewards))
    return out


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """This process computes on one thread like each rank: on a loaded 2-core machine more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train_config(root: Path) -> TrainConfig:
    model_dir = root / "tiny"
    model, tokenizer = tiny_model(seed=0)
    model.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    # SFT on the policy's own samples moves the weights from step 1; the k1 penalty gives GRPO groups variance.
    return config_from_dict({"run_dir": str(root / "run"), "model": str(model_dir), "device": "cpu", "env": "price",
                             "finetune": "lora", "lora.rank": 4, "steps": 3, "sft_warmup_steps": 1,
                             "sft_data": "policy", "sft_min_reward": 0.0, "lr": 1e-2, "sft_lr": 1e-2,
                             "kl": "k1_reward", "kl_coef": 0.5, "rollout.tasks_per_step": 3, "rollout.group_size": 2,
                             "rollout.max_turns": 1, "rollout.max_new_tokens": 6, "checkpoint_every": 1,
                             "progress": False, "placement.nproc": 2})  # fmt: skip


@pytest.fixture(scope="module")
def two_ranks(
    tmp_path_factory: pytest.TempPathFactory, trajectories: list[Trajectory], one_thread: None
) -> dict[str, Any]:
    """One group of 2 gloo ranks serves every test here: starting one costs seconds of imports per rank."""
    root = tmp_path_factory.mktemp("ddp")
    config = _train_config(root)
    # Step 1 in this process (no process group: one rank plays all 3 tasks), as a run killed after its checkpoint;
    # the ranks resume it at step 1 with 2 tasks on rank 0 and 1 on rank 1.
    train(config.override({"steps": 1}))
    ranks = spawn(_rank_main, 2, (trajectories, config))
    assert [r["rank"] for r in ranks] == [0, 1]
    return {"root": root, "config": config, "ranks": ranks}


def test_two_rank_update_equals_one_process_update(trajectories: list[Trajectory], two_ranks: dict[str, Any]) -> None:
    ranks, model = two_ranks["ranks"], two_ranks["config"].model
    tokens = [sum(t.num_sampled_tokens for t in trajectories[:split]) for _, split in CASES]
    assert tokens[0] != sum(t.num_sampled_tokens for t in trajectories) - tokens[0]  # the split is uneven
    for index, (changes, _) in enumerate(CASES):
        reference = _update(BASE.override({"model": model, **changes}), trajectories)
        assert len(reference["grads"]) == changes.get("epochs_per_batch", 1) * changes.get("minibatches", 1)
        initial = _learner(BASE.override({"model": model, **changes})).trainable_state()
        moved = max(float(np.abs(reference["weights"][name] - w.numpy()).max()) for name, w in initial.items())
        assert moved > 5e-5, "the update must move the weights for the comparison to mean anything"
        for rank in ranks:
            got = rank["cases"][index]
            assert len(got["grads"]) == len(reference["grads"]), changes
            for step_grads, ref_grads in zip(got["grads"], reference["grads"], strict=True):
                for g, r in zip(step_grads, ref_grads, strict=True):
                    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-7, err_msg=str(changes))
            for name, ref in reference["weights"].items():
                np.testing.assert_allclose(got["weights"][name], ref, rtol=0, atol=1e-5, err_msg=f"{changes} {name}")
            for key in ("charts/trained_tokens", "charts/trained_trajectories", "charts/offered_trajectories",
                        "charts/groups", "charts/dropped_groups", "charts/policy_version"):  # fmt: skip
                assert got["metrics"].get(key) == reference["metrics"].get(key), (changes, key)
            for key in ("losses/policy_loss", "losses/entropy", "losses/grad_norm", "losses/kl_k1_per_episode",
                        "losses/value_loss"):  # fmt: skip
                if key in reference["metrics"]:
                    assert got["metrics"][key] == pytest.approx(reference["metrics"][key], rel=1e-4, abs=1e-6), key
    # both ranks end bit-identical in every case, and a one-ulp difference on rank 1 is caught on both ranks
    for index in range(len(CASES)):
        assert weights_digest(_tensors(ranks[0]["cases"][index])) == weights_digest(_tensors(ranks[1]["cases"][index]))
    for rank in ranks:
        assert "probe: the weights of rank(s) [1] differ from rank 0's" in rank["desync"]


def _tensors(case: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in case["weights"].items()}


def test_two_rank_training_run_resumes_and_logs_once_per_step(two_ranks: dict[str, Any]) -> None:
    config, root = two_ranks["config"], two_ranks["root"]
    ranks = [r["run"] for r in two_ranks["ranks"]]
    assert [r.rank for r in ranks] == [0, 1]
    assert ranks[0].weights_digest == ranks[1].weights_digest
    assert [row["charts/policy_version"] for row in ranks[0].rows] == [2.0, 3.0]  # continued from version 1
    assert ranks[0].rows[0]["charts/trained_tokens"] > 0 and ranks[0].rows[0]["charts/groups"] == 3.0
    for key in ("rewards/total", "losses/policy_loss", "charts/trained_tokens"):  # every rank saw the whole batch
        assert ranks[1].rows[0][key] == ranks[0].rows[0][key]

    run = Path(config.run_dir)
    assert list(root.rglob("metrics.jsonl")) == [run / "metrics.jsonl"]
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3]
    written = read_trajectories(run)
    assert sorted(written) == [1, 2, 3]
    # the ranks' shares, gathered on rank 0, are exactly the tasks one process samples, in its order
    sampler = EpochSampler(list(make("price").tasks("train")), config.seed)
    for step in (1, 2, 3):
        tasks = sampler.sample(step - 1, config.rollout.tasks_per_step, random.Random(0))
        assert [t.task_id for t in written[step]] == [t.id for t in tasks for _ in range(config.rollout.group_size)]
        # ... and with one process's episode seeds (each task seeded by its index in the whole step)
        rollout_seed = derive_seed(config.seed, "rollout", step - 1)
        samples = range(config.rollout.group_size)
        expected = [derive_seed(rollout_seed, i, t.id, k) for i, t in enumerate(tasks) for k in samples]
        assert [t.seed for t in written[step]] == expected
    assert (run / "checkpoints" / "latest").read_text() == "step_000003"
    assert (run / "policy" / "adapter_config.json").exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from taskrl.cli import main; main()", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_bad_nproc_fails_at_start_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"placement.nproc must be <= rollout.tasks_per_step \(2\), got 3"):
        config_from_dict({"placement.nproc": 3, "rollout.tasks_per_step": 2})
    with pytest.raises(ValueError, match="TrainConfig.device must be auto, cpu or cuda when placement.nproc > 1"):
        config_from_dict({"placement.nproc": 2, "device": "cuda:1"})
    run = _cli("--nproc", "0", "--set", f'run_dir="{tmp_path / "never"}"')
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1 and "placement.nproc must be an integer >= 1" in lines[0]
    assert not (tmp_path / "never").exists()


def test_a_failing_rank_stops_the_group_and_raises_its_error() -> None:
    # ``exec`` of a snippet: a light function, so the ranks start without the model stack
    with pytest.raises(ZeroDivisionError) as failure:
        spawn(exec, 2, ("1 / 0",))
    assert any("raised on rank" in note for note in failure.value.__notes__)
    # rank 1 dies outright while rank 0 waits for it in a collective: rank 0 is stopped, not left hanging
    snippet = "import os, torch.distributed as d\nif d.get_rank() == 1:\n    os._exit(3)\nd.barrier()"
    with pytest.raises(DistributedError, match="rank 1 of 2 exited with code 3 without a result"):
        spawn(exec, 2, (snippet,))


def test_torchrun_starts_the_ranks_of_taskrl_train(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 2 -m taskrl.cli train ...`: each process joins through the environment (env://)
    and the run is the same data-parallel run as --nproc 2: one metrics row per step, weights in sync."""
    config = _train_config(tmp_path)
    sets = {"run_dir": config.run_dir, "model": config.model, "device": "cpu", "env": "price", "finetune": "lora",
            "lora.rank": 4, "steps": 2, "lr": 1e-2, "kl": "k1_reward", "kl_coef": 0.5, "rollout.tasks_per_step": 2,
            "rollout.group_size": 2, "rollout.max_turns": 1, "rollout.max_new_tokens": 6, "checkpoint_every": 1,
            "progress": False}  # fmt: skip
    args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={json.dumps(value)}")]
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "taskrl.cli", "train", *args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("done: 2 steps run") == 1, run.stdout  # rank 0 speaks for the group
    rows = read_metrics(Path(config.run_dir))
    assert [row["step"] for row in rows] == [1, 2] and rows[-1]["charts/episodes"] == 4.0
    assert (Path(config.run_dir) / "checkpoints" / "latest").read_text() == "step_000002"
    # an nproc that contradicts the launcher fails at start on every rank, naming the field
    other = [
        "--set",
        f"run_dir={json.dumps(str(tmp_path / 'bad'))}",
        "--set",
        "rollout.tasks_per_step=4",
        "--set",
        "placement.nproc=3",
    ]
    bad = subprocess.run([*cmd, *other], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "placement.nproc=3 but torchrun started 2 processes" in bad.stderr + bad.stdout


def test_a_peers_death_is_reported_over_the_error_it_caused() -> None:
    # rank 0 reports an error at once; rank 1 dies 0.5 s later without a result (as a peer's crash reaches the
    # others as "Connection reset by peer"): the death is the cause raised, rank 0's report rides along as a note
    snippet = ("import os, time, torch.distributed as d\nif d.get_rank() == 1:\n    time.sleep(0.5)\n    os._exit(3)\n"
               "raise RuntimeError('Connection reset by peer')")  # fmt: skip
    with pytest.raises(DistributedError, match="rank 1 of 2 exited with code 3 without a result") as failure:
        spawn(exec, 2, (snippet,))
    assert any("rank 0 of 2 reported meanwhile" in note and "reset by peer" in note for note in failure.value.__notes__)

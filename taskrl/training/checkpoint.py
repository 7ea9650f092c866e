"""Atomic checkpoints: everything a killed run needs to continue exactly where it stopped.

    RUN_DIR/checkpoints/step_000010/trainable.safetensors   LoRA adapters or unfrozen weights (+ value head)
                                    optimizer.pt              AdamW state
                                    state.json                step, policy version, data position, RNG states
    RUN_DIR/checkpoints/latest                                name of the newest complete checkpoint

With ``learner_backend = "fsdp2"`` the weights and AdamW state go instead to ``step_N/dcp/`` (a
torch.distributed.checkpoint directory: every rank writes its own shards, keyed by parameter name, so any number
of ranks, 1 included, can load it) and the RNG states to ``rng.pt``; the run directory must then be shared by
all ranks (one machine, or a shared filesystem across nodes).

A checkpoint is written into a temporary directory and renamed into place, then ``latest`` is replaced
atomically, so a ``kill -9`` at any moment leaves either the previous or the new checkpoint, never half of
one. Weights with a NaN or infinite entry are refused before anything is written (``NonFiniteWeightsError``).
The LR and entropy schedules are pure functions of the step, so the step is their whole state.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from taskrl.distributed import fsdp
from taskrl.training.runs import CHECKPOINTS, LATEST

if TYPE_CHECKING:
    from taskrl.training.learner import Learner

FORMAT = 1
DCP_DIR = "dcp"
"""Sub-directory of a sharded (fsdp2) checkpoint: torch.distributed.checkpoint's files."""


class CheckpointError(ValueError):
    """A checkpoint is unreadable or does not fit the run being resumed (the CLI prints it as one line)."""


class NonFiniteWeightsError(CheckpointError):
    """Weights to be saved (checkpoint, adapter, export) hold NaN/inf: nothing was written."""


def check_finite(learner: Learner, what: str) -> None:
    """Raise ``NonFiniteWeightsError`` (on every rank) when a trainable tensor has a NaN or infinite entry."""
    bad = learner.nonfinite_names()
    if bad:
        raise NonFiniteWeightsError(
            f"refusing to write {what}: {len(bad)} trainable tensor(s) are not finite (e.g. {bad[0]}); the weights "
            "are poisoned (NaN/inf logprobs or rewards in the data?); resume from the last good checkpoint"
        )


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) RNG states, JSON-safe except the torch tensors."""
    np_state = np.random.get_state()
    return {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }


def set_rng_state(state: dict[str, Any], torch_states: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch_states["torch"])
    if torch.cuda.is_available() and "cuda" in torch_states:
        torch.cuda.set_rng_state_all(torch_states["cuda"])


def save_checkpoint(run_dir: str | Path, step: int, learner: Learner, state: dict[str, Any], *, keep: int) -> Path:
    """Write checkpoint ``step`` atomically, point ``latest`` at it, and delete all but the newest ``keep``.

    Sharded (fsdp2): every rank must call it (each writes its shards); rank 0 does the renames."""
    check_finite(learner, f"checkpoint step {step}")
    sharded = learner.config.placement.learner_backend == "fsdp2"
    group, main = learner.group, learner.group.is_main
    root = Path(run_dir) / CHECKPOINTS
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}" if sharded else root / f".tmp-{name}-{os.getpid()}"  # one name for all ranks
    if main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    torch_states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        torch_states["cuda"] = torch.cuda.get_rng_state_all()
    if sharded:
        fsdp.barrier(group)
        _save_dcp(tmp / DCP_DIR, learner)
        if main:
            torch.save({"rng": torch_states}, tmp / "rng.pt")
    else:
        weights = {k: v.detach().to("cpu").contiguous() for k, v in learner.trainable_state().items()}
        save_file(weights, str(tmp / "trainable.safetensors"))
        torch.save({"optimizer": learner.optimizer.state_dict(), "rng": torch_states}, tmp / "optimizer.pt")
    if main:
        meta = {"format": FORMAT, "step": step, "policy_version": learner.version, "rng": rng_state(),
                "layout": DCP_DIR if sharded else "safetensors", "world": group.world, **state}  # fmt: skip
        (tmp / "state.json").write_text(json.dumps(meta))
        _fsync_dir(tmp)
        if sharded:
            _fsync_dir(tmp / DCP_DIR)
        if final.exists():  # a rerun reached the same step again (e.g. resumed before this one was recorded)
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer = root / f".{LATEST}.tmp-{os.getpid()}"
        pointer.write_text(name)
        os.replace(pointer, root / LATEST)
        _fsync_dir(root)
        for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    if sharded:
        fsdp.barrier(group)  # no rank goes on (or is killed) believing in a checkpoint not yet in place
    return final


def _optimizer_tensors(learner: Learner, *, create: bool) -> dict[str, torch.Tensor]:
    """AdamW state by parameter name (``NAME/exp_avg`` ...); ``create`` allocates it (zeros) where still empty."""
    params = {name: p for name, p in learner.named_trainable_params()}
    if create:
        for param in params.values():
            if not learner.optimizer.state.get(param):
                learner.optimizer.state[param] = {
                    "step": torch.zeros((), dtype=torch.float32),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }
    return fsdp.optimizer_state_tensors(learner.optimizer, params)


def _save_dcp(path: Path, learner: Learner) -> None:
    import torch.distributed.checkpoint as dcp

    optimizer = _optimizer_tensors(learner, create=False)
    dcp.save({"trainable": learner.trainable_state(), "optimizer": optimizer}, checkpoint_id=str(path))


def _load_dcp(path: Path, learner: Learner) -> None:
    """Load in place into this learner's tensors, whatever the number of ranks that wrote the checkpoint."""
    import torch.distributed.checkpoint as dcp

    trainable = learner.trainable_state()
    reader = dcp.FileSystemReader(str(path))
    saved = set(reader.read_metadata().state_dict_metadata)
    stored = {key.removeprefix("trainable.") for key in saved if key.startswith("trainable.")}
    if stored != set(trainable):
        missing, unexpected = sorted(set(trainable) - stored), sorted(stored - set(trainable))
        raise CheckpointError(
            f"checkpoint {path.parent} does not fit this model/config: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; resume with the config the run was started with"
        )
    optimizer = _optimizer_tensors(learner, create=True)
    optimizer = {k: v for k, v in optimizer.items() if f"optimizer.{k}" in saved}  # never-stepped params: no state
    dcp.load({"trainable": trainable, "optimizer": optimizer}, checkpoint_id=str(path))


def load_checkpoint(path: str | Path, learner: Learner) -> dict[str, Any]:
    """Restore weights, optimizer, version and RNG states into ``learner``; return the saved trainer state."""
    path = Path(path)
    try:
        meta = json.loads((path / "state.json").read_text())
        if meta.get("layout") == DCP_DIR:
            extra = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
            _load_dcp(path / DCP_DIR, learner)
        else:
            if learner.sharded:
                raise CheckpointError(
                    f"checkpoint {path} was written by learner_backend='ddp'; resume it with learner_backend='ddp' "
                    "(fsdp2 resumes the sharded checkpoints it writes, on any number of ranks)"
                )
            weights = load_file(str(path / "trainable.safetensors"))
            extra = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable ({e}); delete it to resume from an older one") from e
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')}, this taskrl reads {FORMAT}")
    if meta.get("layout") != DCP_DIR:
        learner.load_trainable_state(weights)
        learner.optimizer.load_state_dict(extra["optimizer"])
    learner.version = int(meta["policy_version"])
    set_rng_state(meta["rng"], extra["rng"])
    return meta


def _fsync_dir(path: Path) -> None:
    """Flush a directory's entries (and its files) so a power cut after the rename keeps the data."""
    for child in path.iterdir() if path.is_dir() else []:
        if child.is_file():
            with child.open("rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

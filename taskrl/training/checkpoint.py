"""Atomic checkpoints: everything a killed run needs to continue exactly where it stopped.

    RUN_DIR/checkpoints/step_000010/trainable.safetensors   LoRA adapters or unfrozen weights (+ value head)
                                    optimizer.pt              AdamW state
                                    state.json                step, policy version, data position, RNG states
    RUN_DIR/checkpoints/latest                                name of the newest complete checkpoint

A checkpoint is written into a temporary directory and renamed into place, then ``latest`` is replaced
atomically, so a ``kill -9`` at any moment leaves either the previous or the new checkpoint, never half of
one. The LR and entropy schedules are pure functions of the step, so the step is their whole state.
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

from taskrl.training.runs import CHECKPOINTS, LATEST

if TYPE_CHECKING:
    from taskrl.training.learner import Learner

FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint is unreadable or does not fit the run being resumed (the CLI prints it as one line)."""


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
    """Write checkpoint ``step`` atomically, point ``latest`` at it, and delete all but the newest ``keep``."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    weights = {k: v.detach().to("cpu").contiguous() for k, v in learner.trainable_state().items()}
    save_file(weights, str(tmp / "trainable.safetensors"))
    torch_states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        torch_states["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({"optimizer": learner.optimizer.state_dict(), "rng": torch_states}, tmp / "optimizer.pt")
    meta = {"format": FORMAT, "step": step, "policy_version": learner.version, "rng": rng_state(), **state}
    (tmp / "state.json").write_text(json.dumps(meta))
    _fsync_dir(tmp)
    if final.exists():  # a rerun reached the same step again (e.g. resumed before this one was recorded)
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer = root / f".{LATEST}.tmp-{os.getpid()}"
    pointer.write_text(name)
    os.replace(pointer, root / LATEST)
    _fsync_dir(root)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path, learner: Learner) -> dict[str, Any]:
    """Restore weights, optimizer, version and RNG states into ``learner``; return the saved trainer state."""
    path = Path(path)
    try:
        meta = json.loads((path / "state.json").read_text())
        weights = load_file(str(path / "trainable.safetensors"))
        extra = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable ({e}); delete it to resume from an older one") from e
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format')}, this taskrl reads {FORMAT}")
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

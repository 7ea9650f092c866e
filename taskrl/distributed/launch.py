"""Launch the data-parallel learner: one ``Trainer`` per rank, locally (``launch``) or under torchrun
(``run_launched``). Above the trainer; the collectives it uses are the leaf ``taskrl.distributed.ddp``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from taskrl.distributed.ddp import (
    COLLECTIVE_TIMEOUT,
    DataParallel,
    rank_device,
    resolve_backend,
    spawn,
    weights_digest,
)

if TYPE_CHECKING:
    from rich.console import Console

    from taskrl.training.config import TrainConfig


@dataclass
class RankResult:
    """What one rank of ``launch`` returns."""

    rank: int
    """The rank that ran."""
    rows: list[dict[str, Any]]
    """Metrics of the steps it ran (identical on every rank: they are computed over the gathered batch)."""
    weights_digest: str
    """Hash of its final trainable weights; equal on every rank of a healthy run."""


def train_rank(config: TrainConfig) -> RankResult:
    """One rank's run: a ``Trainer`` on this rank's device; ranks > 0 print nothing (rank 0 speaks for all)."""
    from rich.console import Console

    from taskrl.training.trainer import Trainer

    group = DataParallel.from_process_group()
    if not group.is_main:  # the monitors' alerts and other warnings would repeat once per rank
        logging.getLogger("taskrl").setLevel(logging.ERROR)
    rank_config = dataclasses.replace(config, device=rank_device(config.device, group.local_rank))
    trainer = Trainer(rank_config, console=None if group.is_main else Console(quiet=True))
    try:
        rows = trainer.train()
        group.check_in_sync(trainer.learner.replicated_state(), "end of the run")
        # The digest of the whole weights (gathered one tensor at a time from a sharded learner).
        return RankResult(group.rank, rows, weights_digest(dict(trainer.learner.gathered_state())))
    finally:
        trainer.close()


def launch(config: TrainConfig, console: Console | None = None) -> list[RankResult]:
    """Train with ``config.placement.nproc`` local learner processes; returns every rank's result (rank 0 first)."""
    backend = resolve_backend(config.placement.dist_backend, config.device)
    if backend == "nccl" and torch.cuda.device_count() < config.placement.nproc:
        from taskrl.training.config import ConfigError

        raise ConfigError(
            f"placement.nproc={config.placement.nproc} with nccl needs {config.placement.nproc} GPUs, found "
            f"{torch.cuda.device_count()}; lower nproc or use device='cpu' (gloo)"
        )
    if console is not None:
        console.print(f"data-parallel learner: {config.placement.nproc} processes, backend {backend}")
    return spawn(train_rank, config.placement.nproc, (config,), backend=backend)


def launched_world() -> int:
    """WORLD_SIZE when an env:// launcher (torchrun) started this process as one rank of a group, else 1."""
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ.get("WORLD_SIZE", "1"))
    return 1


def run_launched(config: TrainConfig) -> RankResult:
    """This process's rank of a group that torchrun started (rendezvous from RANK, WORLD_SIZE, MASTER_ADDR...)."""
    from taskrl.training.config import ConfigError

    world = launched_world()
    if config.placement.nproc not in (1, world):
        raise ConfigError(
            f"placement.nproc={config.placement.nproc} but torchrun started {world} processes; under torchrun the "
            "launcher sets the number of ranks: drop --nproc"
        )
    config = dataclasses.replace(config, placement=dataclasses.replace(config.placement, nproc=world))  # re-validated
    backend = resolve_backend(config.placement.dist_backend, config.device)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    try:
        return train_rank(config)
    finally:
        dist.destroy_process_group()

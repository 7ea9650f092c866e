"""The sharded learner (``learner_backend = "fsdp2"``): FSDP2 per decoder layer + root, on the data-parallel group.

``shard(graph, group)`` applies ``torch.distributed.fsdp.fully_shard`` to every decoder block and then to the
``LearnerGraph`` root (embeddings, final norm, LM head), on a 1-D device mesh over the group's ranks (gloo on CPU,
nccl on CUDA). Each rank then holds 1/world of every parameter, gradient and AdamW state; the layers are
all-gathered for their forward and backward and the gradients reduce-scattered, summed (not averaged: the loss
is already divided by the global token count, as with DDP). Every collective needs every rank, so ranks with
fewer micro-batches run zero-weight ``filler`` passes. ``full_tensor`` / ``gathered`` materialise one
parameter at a time (weight sync, export); ``clip_grad_norm`` clips sharded and replicated gradients together.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from taskrl.distributed.ddp import DataParallel
from taskrl.training.batching import MicroBatch, TokenSequence, collate


def is_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor (an FSDP2 parameter, its gradient or optimizer state)."""
    return isinstance(tensor, DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; a plain tensor as it is."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (an all-gather for a DTensor, every rank must call it); a plain tensor as it is."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


def shard(graph: nn.Module, layers: Sequence[nn.Module], group: DataParallel) -> None:
    """``fully_shard`` each decoder block, then ``graph`` (the root: what the blocks leave), summing gradients."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(graph.parameters()).device
    mesh = init_device_mesh(device.type, (group.world,))
    modules = [fully_shard(layer, mesh=mesh) for layer in layers]
    modules.append(fully_shard(graph, mesh=mesh))
    for module in modules:
        # The learner divides each loss by the global token count: the ranks' gradients must be summed.
        module.set_gradient_divide_factor(1.0)  # type: ignore[operator]
        module.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]


def filler_batch(pad_id: int, device: torch.device | str) -> MicroBatch:
    """A 2-token micro-batch a rank without work of its own runs (at zero loss weight) to join the collectives."""
    return collate([TokenSequence(0, [pad_id, pad_id], [1], torch.zeros(1), 0)], pad_id, device)


def padded(batches: list[list[int]], group: DataParallel) -> list[list[int] | None]:
    """``batches`` followed by ``None`` (a filler pass) up to the largest count over the ranks."""
    most = max(group.all_gather(len(batches)))
    return [*batches, *([None] * (most - len(batches)))]


@torch.no_grad()
def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float, group: DataParallel) -> float:
    """The global gradient norm (sharded gradients: the sum of the ranks' local squares; replicated ones: once),
    then the gradients scaled by ``min(1, max_norm / (norm + 1e-6))`` like ``torch.nn.utils.clip_grad_norm_``."""
    grads = [p.grad for p in params if p.grad is not None]
    sharded = sum(
        (g.to_local().float().pow(2).sum() for g in grads if is_sharded(g)), torch.zeros((), dtype=torch.float64)
    )
    replicated = sum((g.float().pow(2).sum() for g in grads if not is_sharded(g)), torch.zeros((), dtype=torch.float64))
    total_sq = group.sum([float(sharded)])[0] + float(replicated)
    norm = math.sqrt(total_sq) if math.isfinite(total_sq) else float("nan")
    if math.isfinite(norm) and math.isfinite(max_norm):
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for g in grads:
                local(g).mul_(coef)
    return norm


def gathered(state: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` one at a time, in sorted name order (the same on every rank): at most one gathered
    parameter is alive at once beyond what the caller keeps."""
    for name in sorted(state):
        yield name, full_tensor(state[name]).detach()


def copy_full_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """``target.copy_(full)`` where ``target`` may be a DTensor: each rank keeps its own shard of ``full``."""
    if is_sharded(target):
        from torch.distributed.tensor import distribute_tensor

        local = distribute_tensor(
            full.to(target.device, target.dtype), target.device_mesh, target.placements, src_data_rank=None
        )
        target.to_local().copy_(local.to_local())
    else:
        target.copy_(full.to(target.device, target.dtype))


def barrier(group: DataParallel) -> None:
    if group.active:
        dist.barrier()


def optimizer_state_tensors(optimizer: torch.optim.Optimizer, params: dict[str, Any]) -> dict[str, torch.Tensor]:
    """AdamW state keyed ``NAME/exp_avg`` ... by parameter name: what a resharding checkpoint stores."""
    out: dict[str, torch.Tensor] = {}
    for name, param in params.items():
        for key, value in optimizer.state.get(param, {}).items():
            if isinstance(value, torch.Tensor):
                out[f"{name}/{key}"] = value
    return out

"""Memory accounting on any device: peak bytes of live tensors, and the bytes a (sharded) model and optimizer hold.

    with PeakMemory() as peak:
        loss = model(x).sum(); loss.backward()
    peak.peak_bytes  # the most bytes that tensors created inside the block held at once (activations, grads)

``PeakMemory`` counts every tensor storage an operator creates inside the block (a ``TorchDispatchMode``) until
it is freed, so it works on CPU where torch keeps no allocator statistics; on CUDA ``torch.cuda.max_memory_allocated``
says the same from the allocator. ``tensor_bytes`` / ``optimizer_bytes`` count the bytes *this rank* holds: the
local shard of a DTensor (FSDP2), the whole tensor otherwise.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakMemory(TorchDispatchMode):
    """Live and peak bytes of the tensor storages created by operators run inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._seen: set[int] = set()
        self._lock = threading.Lock()

    def _track(self, tensor: torch.Tensor) -> None:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            return  # a wrapper subclass (DTensor): its local tensor is created by an op of its own, counted there
        try:
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
        except RuntimeError:  # no real storage (functional/fake tensors)
            return
        size = storage.nbytes()
        if size == 0:
            return
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            self.live_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        with self._lock:
            if key in self._seen:
                self._seen.discard(key)
                self.live_bytes -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and not leaf.is_meta:
                self._track(leaf)
        return out


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: the local shard of a DTensor, the tensor itself otherwise."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank holds for ``tensors`` (each counted once)."""
    seen: set[tuple[int, int, int]] = set()  # (storage, offset, size): ``to_local()`` makes a new object each call
    total = 0
    for tensor in tensors:
        local = local_tensor(tensor)
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), local.numel())
        if key not in seen and local.numel():
            seen.add(key)
            total += local.numel() * local.element_size()
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds for the optimizer's state (AdamW: exp_avg, exp_avg_sq, step)."""
    return tensor_bytes(v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))

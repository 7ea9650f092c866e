"""The data-parallel learner's collectives: N processes, one torch.distributed group, one training run.

A leaf below the trainer (it imports nothing of taskrl); the launcher that builds a ``Trainer`` per rank is
``taskrl.distributed.launch``: ``taskrl train CONFIG --nproc N`` starts N local processes (gloo on CPU, nccl on
CUDA, one GPU per local rank) that each build a ``Trainer``; under ``torchrun`` (one node or several) each process
it starts joins the group through the environment instead. Every rank plays its contiguous share of each step's
tasks (whole groups), all ranks see the gathered trajectories, and ``Learner`` all-reduces gradients through the
``DataParallel`` object it is given. One process (``world == 1``) runs the same code with no communication.
"""

from __future__ import annotations

import hashlib
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

T = TypeVar("T")

BUCKET_ELEMENTS = 1 << 24
"""Gradients are all-reduced in flat buckets of at most this many elements (64 MiB in float32)."""
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
"""A rank waiting longer than this in a collective fails (a peer crashed or hangs in a rollout)."""
EXIT_GRACE_S = 10.0
"""Seconds the launcher gives a rank whose pipe closed to exit, so its exit code can be reported."""
PEER_DEATH_GRACE_S = 2.0
"""How long a rank's reported error waits for a silent peer's death to show: the death, the root cause, is what
``spawn`` raises (rank 0's "Connection reset by peer" from a barrier once won the race and was raised instead)."""


class DistributedError(RuntimeError):
    """A rank of a data-parallel run failed or never started; the message names the rank and the cause."""


class DesyncError(DistributedError):
    """The ranks' weights differ although every update is all-reduced: a bug, or a non-deterministic op."""


class DataParallel:
    """This process's place in the learner group (``rank`` of ``world``) and the collectives taskrl uses.

    Built with no arguments it is the single-process group: every collective returns its input unchanged.
    """

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world
        self.local_rank = int(os.environ.get("LOCAL_RANK", rank))
        self.comm_device = torch.device("cpu")
        if world > 1 and dist.get_backend() == "nccl":
            self.comm_device = torch.device("cuda", torch.cuda.current_device())

    @classmethod
    def from_process_group(cls) -> DataParallel:
        """The initialised default process group (launched by ``launch`` or torchrun), else one process."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run directory (metrics, trajectories, checkpoints, exports) for the whole group."""
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous share; concatenated in rank order the shares are ``items`` (sizes differ by <= 1)."""
        base, extra = divmod(len(items), self.world)
        start = self.rank * base + min(self.rank, extra)
        return list(items[start : start + base + (1 if self.rank < extra else 0)])

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (any picklable value), in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def gather(self, items: Sequence[T]) -> list[T]:
        """Every rank's items concatenated in rank order (the inverse of ``shard``), on every rank."""
        return [item for part in self.all_gather(list(items)) for item in part]

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums over ranks (float64)."""
        if not self.active or not values:
            return [float(v) for v in values]
        buffer = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(buffer)
        return buffer.tolist()

    def all_reduce_gradients(self, params: Sequence[torch.Tensor]) -> None:
        """Sum ``.grad`` over ranks, in place. A parameter no rank has a gradient for keeps ``None`` (AdamW then
        skips it, as one process would); one that only some ranks touched gets zeros on the others."""
        if not self.active:
            return
        touched = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.comm_device)
        dist.all_reduce(touched)
        reduced = [p for p, count in zip(params, touched.tolist(), strict=True) if count]
        for p in reduced:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for bucket in _buckets(reduced):
            grads = [p.grad for p in bucket]
            flat = torch.cat([g.reshape(-1) for g in grads]).to(self.comm_device, self._wire_dtype(grads[0].dtype))
            dist.all_reduce(flat)
            for g, piece in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(piece.view_as(g))

    @torch.no_grad()
    def broadcast_(self, tensors: dict[str, torch.Tensor]) -> None:
        """Overwrite every rank's tensors with rank 0's, in place (names sorted so all ranks agree on order)."""
        if not self.active:
            return
        for name in sorted(tensors):
            tensor = tensors[name]
            buffer = tensor.detach().to(self.comm_device, self._wire_dtype(tensor.dtype)).contiguous()
            dist.broadcast(buffer, src=0)
            tensor.copy_(buffer)

    def check_in_sync(self, tensors: dict[str, torch.Tensor], what: str) -> None:
        """Raise ``DesyncError`` unless every rank holds bit-identical ``tensors`` (one hash per rank, gathered)."""
        if not self.active:
            return
        digest = weights_digest(tensors)
        digests = self.all_gather(digest)
        if len(set(digests)) > 1:
            differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
            raise DesyncError(
                f"{what}: the weights of rank(s) {differing} differ from rank 0's; the ranks must stay identical "
                "(rerun with nproc=1 to rule out the data-parallel learner, and report it)"
            )

    def _wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        # gloo has no half-precision reductions; nccl reduces bf16/fp16 natively.
        if self.comm_device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
            return torch.float32
        return dtype


def _buckets(params: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive parameters of one dtype and device, at most ``BUCKET_ELEMENTS`` elements per bucket."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        last = buckets[-1] if buckets else None
        if last is None or size + p.numel() > BUCKET_ELEMENTS or (last[0].dtype, last[0].device) != (p.dtype, p.device):
            buckets.append([p])
            size = p.numel()
        else:
            last.append(p)
            size += p.numel()
    return buckets


def weights_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A hash of the exact bytes of ``tensors`` (sorted by name): equal digests mean bit-identical weights."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# -- launching ---------------------------------------------------------------------------------------
def resolve_backend(backend: str, device: str) -> str:
    """``auto`` -> nccl when the ranks use CUDA, else gloo."""
    if backend != "auto":
        return backend
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return "nccl" if cuda else "gloo"


def rank_device(device: str, local_rank: int) -> str:
    """The device of one rank: ``auto``/``cuda`` -> ``cuda:LOCAL_RANK`` when CUDA is present; ``cpu`` stays."""
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{local_rank}"
    return "cpu" if device == "auto" else device


_DIED = object()
"""Marks a rank that exited without sending anything."""


@dataclass
class _Failure:
    """What a failed rank sends home: the exception (when picklable) and its formatted traceback."""

    error: BaseException | None
    message: str
    trace: str


def _rank_main(
    rank: int, world: int, port: int, backend: str, fn: Callable[..., Any], args: tuple[Any, ...], result: Connection
) -> None:
    """Body of one spawned rank: join the group on loopback, run ``fn(*args)``, send its result or error home."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})  # fmt: skip
    # N ranks on one machine share its cores: without this each one starts a full-size thread pool.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        # the launcher hosts the group's store on a port it holds (see ``spawn``): every rank, 0 included, is a client
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=COLLECTIVE_TIMEOUT)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
        try:
            result.send(fn(*args))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the launcher, or the others hang
        trace = traceback.format_exc()
        try:
            result.send(_Failure(e, f"{type(e).__name__}: {e}", trace))
        except Exception:  # the exception itself does not pickle: send its text
            result.send(_Failure(None, f"{type(e).__name__}: {e}", trace))
    finally:
        result.close()


def spawn(fn: Callable[..., T], nproc: int, args: tuple[Any, ...] = (), *, backend: str = "gloo") -> list[T]:
    """Run ``fn(*args)`` in ``nproc`` fresh processes forming one process group on loopback; results by rank.

    ``fn`` must be importable by name (a module-level function). When a rank fails or dies, the others are
    stopped (they would wait in their next collective until the timeout) and its exception is re-raised here,
    with a note naming the rank and its traceback.
    """
    if nproc < 1:
        raise ValueError(f"spawn needs nproc >= 1, got {nproc}")
    context = mp.get_context("spawn")
    # The rendezvous store lives here, bound to a port the kernel picks and this process keeps: a port picked free,
    # released and bound by rank 0 later could be taken in between (it was, by a neighbour: EADDRINUSE).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=COLLECTIVE_TIMEOUT)
    port = store.port
    processes, readers = [], []
    for rank in range(nproc):
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(target=_rank_main, args=(rank, nproc, port, backend, fn, args, writer))
        process.start()
        writer.close()  # only the rank holds the writing end: its death reads as EOF here at once
        processes.append(process)
        readers.append(reader)
    done: dict[int, Any] = {}

    def outcome(rank: int, ready: list[Any]) -> Any:
        """The rank's result, ``_Failure`` or ``_DIED``; ``None`` while it is still running."""
        if readers[rank] in ready or readers[rank].poll():
            try:
                return readers[rank].recv()
            except EOFError:
                return _DIED
        return _DIED if processes[rank].sentinel in ready else None

    try:
        while len(done) < nproc:
            pending = [rank for rank in range(nproc) if rank not in done]
            # A pipe's EOF or a process sentinel: a rank that dies before it even unpickled its pipe is seen too.
            ready = wait([readers[r] for r in pending] + [processes[r].sentinel for r in pending])
            seen = {rank: value for rank in pending if (value := outcome(rank, ready)) is not None}
            if any(isinstance(v, _Failure) for v in seen.values()) and _DIED not in seen.values():
                # A peer's death reaches the others as a collective error ("Connection reset by peer") within
                # moments: look at the silent ranks again before blaming the rank that merely reported it.
                silent = [r for r in pending if r not in seen]
                late = wait([processes[r].sentinel for r in silent], timeout=PEER_DEATH_GRACE_S)
                seen |= {rank: value for rank in silent if (value := outcome(rank, late)) is not None}
            died = [rank for rank, value in seen.items() if value is _DIED]
            if died:  # the root cause: the others' errors follow from it
                rank = died[0]
                processes[rank].join(timeout=EXIT_GRACE_S)
                death = DistributedError(
                    f"rank {rank} of {nproc} exited with code {processes[rank].exitcode} without a result "
                    "(killed? out of memory?); the other ranks were stopped"
                )
                for other, value in sorted(seen.items()):  # nothing is lost: what the others reported rides along
                    if isinstance(value, _Failure):
                        death.add_note(f"rank {other} of {nproc} reported meanwhile: {value.message}")
                raise death
            for rank, value in sorted(seen.items()):
                if isinstance(value, _Failure):
                    error = value.error or DistributedError(value.message)
                    error.add_note(f"(raised on rank {rank} of {nproc})\n{value.trace}")
                    raise error
                done[rank] = value
    finally:
        for process in processes:
            if process.is_alive() and len(done) < nproc:
                process.terminate()
            process.join(timeout=30)
        for reader in readers:
            reader.close()
    return [done[rank] for rank in range(nproc)]

"""Sandbox-wide limits: one cgroup per sandbox (memory, pids, CPU) where this machine lets us make one, else a
watchdog over the command's whole process tree (its summed RSS and CPU time) on top of per-process rlimits.

``Cgroups.find()`` probes once which controllers can really be delegated here (cgroup v2 with the controllers
enabled in our subtree, or the v1 hierarchies, e.g. as root); ``describe_limits()`` says which mechanism holds
each limit (it is logged when a sandbox starts). ``TreeWatchdog`` is what holds the limits a cgroup cannot.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import queue
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000
_TOKEN = os.urandom(3).hex()  # two sandboxes of one process (or a reused pid) never pick the same name
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Hierarchy:
    """Where children of our cgroup are made for some controllers: ``version`` 1 or 2."""

    parent: Path
    version: int
    controllers: frozenset[str]


class Cgroups:
    """Per-command cgroups under the delegated hierarchies found by ``find``."""

    _counter = itertools.count()

    def __init__(self, hierarchies: list[Hierarchy], why_not: dict[str, str]) -> None:
        self.hierarchies = hierarchies
        self.why_not = why_not
        """Controllers that could not be delegated here, with the reason (for the log and the docs)."""

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset().union(*(h.controllers for h in self.hierarchies))

    @classmethod
    @functools.cache
    def find(cls) -> Cgroups:
        """Probe every mounted hierarchy once: a child must really be creatable and have the control file."""
        found: list[Hierarchy] = []
        why_not: dict[str, str] = {}
        have: set[str] = set()
        for parent, version, offered in _candidates():
            wanted = [c for c in offered if c not in have]
            if not wanted:
                continue
            probe = parent / f"taskrl-probe-{os.getpid()}"
            try:
                probe.mkdir()
            except OSError as e:
                for c in wanted:
                    why_not.setdefault(c, f"cannot create a cgroup under {parent}: {e.strerror}")
                continue
            try:
                usable = {c for c in wanted if (probe / _control_file(c, version)).exists()}
                for c in set(wanted) - usable:
                    why_not.setdefault(c, f"{parent} does not delegate the {c} controller (v{version})")
            finally:
                with contextlib.suppress(OSError):
                    probe.rmdir()
            if usable:
                found.append(Hierarchy(parent, version, frozenset(usable)))
                have |= usable
                _sweep(parent)
                atexit.register(_sweep, parent, os.getpid())
        for c in CONTROLLERS:
            if c not in have:
                why_not.setdefault(c, "no mounted cgroup hierarchy offers it to this process")
            else:
                why_not.pop(c, None)
        return cls(found, why_not)

    def create(self, memory_bytes: int, max_processes: int, cpus: float) -> list[Path]:
        """One fresh cgroup per hierarchy with the limits written; the caller joins and removes them."""
        if not self.hierarchies:
            return []
        name = f"taskrl-{os.getpid()}-{next(self._counter)}-{_TOKEN}"
        made: list[Path] = []
        try:
            for h in self.hierarchies:
                path = h.parent / name
                path.mkdir()
                made.append(path)
                if "memory" in h.controllers:
                    if h.version == 2:
                        (path / "memory.max").write_text(str(memory_bytes))
                        with contextlib.suppress(OSError):
                            (path / "memory.swap.max").write_text("0")
                    else:
                        (path / "memory.limit_in_bytes").write_text(str(memory_bytes))
                        with contextlib.suppress(OSError):  # only where swap accounting is on
                            (path / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                if "pids" in h.controllers:
                    (path / "pids.max").write_text(str(max_processes))
                if "cpu" in h.controllers:
                    quota = max(1000, int(cpus * _CPU_PERIOD_US))
                    if h.version == 2:
                        (path / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")
                    else:
                        (path / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
                        (path / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError:
            for path in made:
                remove(path)
            raise
        return made

    @staticmethod
    def oom_killed(paths: list[Path]) -> bool:
        """Whether the kernel killed a process of these cgroups for exceeding their memory limit."""
        for path in paths:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    match = re.search(r"^oom_kill (\d+)$", (path / name).read_text(), re.M)
                    if match and int(match.group(1)) > 0:
                        return True
        return False


def _control_file(controller: str, version: int) -> str:
    if controller == "memory":
        return "memory.max" if version == 2 else "memory.limit_in_bytes"
    if controller == "cpu":
        return "cpu.max" if version == 2 else "cpu.cfs_quota_us"
    return "pids.max"


def _candidates() -> list[tuple[Path, int, list[str]]]:
    """(our own cgroup directory, version, controllers it may offer) in every mounted hierarchy; v2 first."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            own["" if controllers == "" else controllers] = path
    v2: list[tuple[Path, int, list[str]]] = []
    v1: list[tuple[Path, int, list[str]]] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            fstype, mount, options = fields[sep + 1], fields[4], fields[-1].split(",")
            if fstype == "cgroup2" and "" in own:
                parent = Path(mount + own[""])
                with contextlib.suppress(OSError):
                    offered = (parent / "cgroup.subtree_control").read_text().split()
                    v2.append((parent, 2, [c for c in CONTROLLERS if c in offered]))
            elif fstype == "cgroup":
                for key, path in own.items():
                    names = key.split(",")
                    offered = [c for c in CONTROLLERS if c in names and c in options]
                    if offered:
                        v1.append((Path(mount + path), 1, offered))
    return v2 + v1


def _sweep(parent: Path, mine: int | None = None) -> None:
    """Remove empty cgroups left by dead processes (or, at exit, by this one: ``mine`` is its pid)."""
    for path in parent.glob("taskrl-*"):
        owner = re.match(r"^taskrl-(?:probe-)?(\d+)", path.name)
        if owner and (int(owner.group(1)) == mine or not Path(f"/proc/{owner.group(1)}").exists()):
            with contextlib.suppress(OSError):
                path.rmdir()


def kill_all(paths: list[Path]) -> None:
    """SIGKILL whatever is in the cgroups now (processes that left the process group included). One pass: a
    fork racing it is caught by the next pass (the timeout path and the cgroup remover call it again)."""
    for path in paths[:1]:  # every hierarchy holds the same processes
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def remove(path: Path) -> None:
    """rmdir now, or, while the kernel still counts the exiting processes, soon after on the reaper thread
    (waiting here would add milliseconds to every command)."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return
    except OSError:
        _REAPER.add(path)


class _CgroupReaper:
    """A daemon thread that removes cgroups once the kernel has released their last process; independent of
    any event loop, so a loop that closes early leaves nothing behind (the exit sweep takes what remains)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add(self, path: Path) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="taskrl-cgroup-reaper", daemon=True)
                self._thread.start()
        self._queue.put(path)

    def _run(self) -> None:
        pending: list[tuple[Path, float]] = []
        while True:
            with contextlib.suppress(queue.Empty):
                pending.append((self._queue.get(timeout=0.005 if pending else None), time.monotonic()))
            still = []
            for path, since in pending:
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    if time.monotonic() - since < 30:
                        kill_all([path])
                        still.append((path, since))
            pending = still


_REAPER = _CgroupReaper()


# -- the fallback: a watchdog over the process tree -----------------------------------------------------------


def _process_table() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, resident bytes, CPU seconds incl. reaped children) of every process we can read."""
    table: dict[int, tuple[int, int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            fields = stat[stat.rindex(")") + 2 :].split()
            # fields[0] is state (field 3); ppid is field 4, utime..cstime fields 14-17, rss field 24
            cpu = sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
            table[int(entry.name)] = (int(fields[1]), int(fields[21]) * _PAGE, cpu)
    return table


def tree_usage(root_pid: int) -> tuple[int, float, int]:
    """(summed RSS bytes, summed CPU seconds, process count) of ``root_pid`` and all its descendants."""
    table = _process_table()
    pids = _descendants(root_pid, table)
    return sum(table[p][1] for p in pids), sum(table[p][2] for p in pids), len(pids)


def _descendants(root_pid: int, table: dict[int, tuple[int, int, float]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        if pid in table:
            out.append(pid)
        todo += children.get(pid, [])
    return out


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of a process (shared pages divided among their users), or None if unreadable."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        for line in f:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) * 1024
    return None


_OWN_MOUNT_NS = os.stat("/proc/self/ns/mnt").st_ino


def tmpfs_used(pids: list[int], mounts: tuple[str, ...], size: int) -> int | None:
    """Bytes held in the sandbox's private tmpfs ``mounts`` of ``size`` bytes each (its /tmp and /dev/shm: memory
    no process's RSS shows), seen through the first of ``pids`` whose view has them; None if none has."""
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}/ns/mnt").st_ino == _OWN_MOUNT_NS:
                continue  # still in ours (the launcher, bubblewrap's monitor): its /tmp is the host's
            used = 0
            for mount in mounts:
                st = os.statvfs(f"/proc/{pid}/root{mount}")
                if abs(st.f_blocks * st.f_frsize - size) > _PAGE:  # not ours yet (bubblewrap still setting up)
                    break
                used += (st.f_blocks - st.f_bfree) * st.f_frsize
            else:
                return used
    return None


WATCHDOG_PERIOD_S = 0.1
"""How often the watchdog samples a command far from its limits (commands shorter than this cost nothing)."""
WATCHDOG_FAST_PERIOD_S = 0.01
"""How often it samples once a command has used half of a limit: the overshoot is what it adds in one period."""
FAST_START_S = 0.5
"""Seconds after a command starts during which it is sampled at the fast period (a command that floods from its
first instant; bubblewrap's own start-up takes part of it on a loaded machine)."""
DISK_RESERVE_BYTES = 256 << 20
"""A command is stopped before it leaves the workspace's file system less free space than this, whatever its
quota (a quota larger than the free space must not fill the host's disk)."""
MEMORY_MECHANISM = "watchdog over the summed PSS of the sandbox's processes plus its /tmp and /dev/shm"
DISK_MECHANISM = (
    "watchdog over the free space the command consumed (confirmed by its workspace's growth), plus RLIMIT_FSIZE "
    "at the remaining quota"
)


class TreeWatchdog:
    """Polls a command's process tree and its workspace's file system; ``check()`` says which limit it broke.

    Holds, where no cgroup does, the sandbox-wide memory limit (the summed RSS of the tree, confirmed with the
    summed PSS so shared pages count once, plus what its private tmpfs mounts hold) and CPU-seconds limit, and
    everywhere the workspace's disk quota when it is not a size-limited mount (the free space the command
    consumed, confirmed by ``disk_written``, the bytes the command's own tree gained, where given; never below
    ``DISK_RESERVE_BYTES`` free). ``period()`` shortens once a limit is half used;
    ``peak_memory``/``peak_disk`` are the highest readings (for the benchmark and the log).
    """

    def __init__(
        self,
        root_pid: int,
        *,
        memory_bytes: int | None,
        cpu_seconds: float | None,
        disk_path: str | None,
        disk_bytes: int | None,
        tmpfs_mounts: tuple[str, ...] = (),
        tmpfs_bytes: int = 0,
        disk_written: Callable[[], int | None] | None = None,
    ) -> None:
        self.root_pid = root_pid
        self.memory_bytes, self.cpu_seconds = memory_bytes, cpu_seconds
        self.disk_path, self.disk_bytes = disk_path, disk_bytes
        self.tmpfs_mounts, self.tmpfs_bytes = tmpfs_mounts, tmpfs_bytes
        self.disk_written = disk_written
        self._free_at_start = _free_bytes(disk_path) if disk_path and disk_bytes is not None else None
        self.peak_memory = 0
        self.peak_disk = 0
        self._load = 0.0
        self._started = time.monotonic()

    @property
    def needed(self) -> bool:
        return self.memory_bytes is not None or self.cpu_seconds is not None or self._free_at_start is not None

    def period(self) -> float:
        """Seconds until the next sample: short for the first ``FAST_START_S`` (a command that floods from its
        first instant) and once a limit is half used."""
        fast = self._load >= 0.5 or time.monotonic() - self._started < FAST_START_S
        return WATCHDOG_FAST_PERIOD_S if fast else WATCHDOG_PERIOD_S

    def check(self) -> str | None:
        self._load = 0.0
        if self.memory_bytes is not None or self.cpu_seconds is not None:
            table = _process_table()
            pids = _descendants(self.root_pid, table)
            cpu = sum(table[p][2] for p in pids)
            if self.memory_bytes is not None:
                memory = sum(table[p][1] for p in pids) + (tmpfs_used(pids, self.tmpfs_mounts, self.tmpfs_bytes) or 0)
                if memory > self.memory_bytes:  # RSS counts shared pages in every process: confirm with PSS
                    pss = [pss_bytes(p) for p in pids]
                    memory = sum(table[p][1] if v is None else v for p, v in zip(pids, pss, strict=True))
                    memory += tmpfs_used(pids, self.tmpfs_mounts, self.tmpfs_bytes) or 0
                self.peak_memory = max(self.peak_memory, memory)
                self._load = memory / self.memory_bytes
                if memory > self.memory_bytes:
                    return (
                        f"memory limit: the sandbox's processes and its /tmp and /dev/shm held {memory >> 20} MiB "
                        f"together (limit {self.memory_bytes >> 20} MiB; {MEMORY_MECHANISM}: no memory cgroup "
                        "here), killed"
                    )
            if self.cpu_seconds is not None and cpu > self.cpu_seconds:
                return f"CPU time limit exceeded: the sandbox's processes used {cpu:.0f} CPU-seconds together"
        if self._free_at_start is not None:
            free = _free_bytes(self.disk_path)  # type: ignore[arg-type]
            used = self._free_at_start - free
            if used > self.disk_bytes and self.disk_written is not None:  # type: ignore[operator]
                # free space is shared with every other writer (a checkpoint, another workspace): confirm the
                # drop is the command's own before the kill (None: its tree cannot be measured, the drop stands)
                own = self.disk_written()
                used = used if own is None else own
            self.peak_disk = max(self.peak_disk, used)
            budget = max(1, self.disk_bytes)  # type: ignore[type-var]
            self._load = max(self._load, used / budget, (DISK_RESERVE_BYTES * 2) / max(free, 1))
            if used > self.disk_bytes:  # type: ignore[operator]
                return (
                    f"disk quota: the command wrote more than the workspace's remaining "
                    f"{max(0, self.disk_bytes) >> 20} MiB ({DISK_MECHANISM}), killed; delete files to make room"  # type: ignore[arg-type]
                )
            if free < DISK_RESERVE_BYTES:
                return (
                    f"disk quota: the workspace's file system is almost full ({free >> 20} MiB left), killed; "
                    "delete files to make room"
                )
        return None


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def describe_limits(cgroups: Cgroups | None) -> str:
    """Which mechanism holds each limit, e.g. 'memory, pids, cpu: cgroup v1' (logged at sandbox start)."""
    if cgroups is None:
        return "unsandboxed: rlimits only"
    parts = []
    for h in cgroups.hierarchies:
        parts.append(f"{', '.join(sorted(h.controllers))}: cgroup v{h.version} under {h.parent}")
    fallback = {"memory": MEMORY_MECHANISM + " + RLIMIT_AS", "pids": "RLIMIT_NPROC", "cpu": "CPU-seconds watchdog"}
    for c, why in sorted(cgroups.why_not.items()):
        parts.append(f"{c}: {fallback[c]} ({why})")
    return "; ".join(parts)

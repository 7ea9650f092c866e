"""Reliability: sandbox bounds. Measured peak memory and disk of hostile commands vs the sandbox's limits.

Runs real bubblewrap sandboxes with the cgroup path switched off (``SandboxConfig(cgroups=False)``), so the
fallback that holds the limits on a machine without delegated cgroups is what is measured: the watchdog over
the sandbox's summed memory (PSS of its processes plus its /tmp and /dev/shm) and, for the disk, the watchdog
over the free space a command consumed plus RLIMIT_FSIZE at the remaining quota. An independent sampler
(2 ms, every process of the sandbox's host uid, so taskrl must run as root) measures the peaks the host saw.

    python benchmarks/reliability_sandbox.py            # prints lscpu's model name and one row per scenario
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from taskrl.envs.code import limits
from taskrl.envs.code.sandbox import CommandResult, Sandbox, SandboxConfig, host_uid

MIB = 1 << 20
MEMORY_LIMIT = 512 * MIB
DISK_QUOTA = 64 * MIB
TMP_BYTES = 256 * MIB
HOG = "python -c \"import time; b = bytearray({n}); b[::4096] = b'x' * len(b[::4096]); time.sleep(3)\""


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


class HostSampler:
    """Every 2 ms: the memory of every process of the sandbox's host uid (their summed PSS, RSS where PSS is
    unreadable) plus their private tmpfs, and the free space consumed on a file system; keeps the peaks."""

    def __init__(self, disk_path: str) -> None:
        self.disk_path = disk_path
        self.free_at_start = os.statvfs(disk_path).f_bavail * os.statvfs(disk_path).f_frsize
        self.peak_memory = self.peak_disk = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _pids(self) -> list[int]:
        uid, out = host_uid(), []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        out.append(int(entry.name))
                except OSError:
                    continue
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = self._pids()
            tmpfs = limits.tmpfs_used(pids, ("/tmp", "/dev/shm"), TMP_BYTES) or 0
            memory = sum(limits.pss_bytes(p) or 0 for p in pids) + tmpfs
            st = os.statvfs(self.disk_path)
            self.peak_memory = max(self.peak_memory, memory)
            self.peak_disk = max(self.peak_disk, self.free_at_start - st.f_bavail * st.f_frsize)
            time.sleep(0.002)

    def __enter__(self) -> HostSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Row:
    scenario: str
    limit: int
    host_peak: int
    watchdog_peak: int | None
    stopped: str | None

    def line(self) -> str:
        watchdog = "-" if self.watchdog_peak is None else f"{self.watchdog_peak / MIB:.0f}"
        return (f"| {self.scenario} | {self.limit / MIB:.0f} | {self.host_peak / MIB:.0f} | {watchdog} | "
                f"{self.host_peak / self.limit:.2f} | {(self.stopped or 'NOT STOPPED')[:70]} |")  # fmt: skip


async def measure(sandbox: Sandbox, command: str, workspace: str, *, disk_quota: int | None = None
                  ) -> tuple[CommandResult, HostSampler]:  # fmt: skip
    with HostSampler(workspace) as sampler:
        result = await sandbox.run(command, workspace, disk_quota_bytes=disk_quota)
    return result, sampler


async def scenarios() -> list[Row]:
    sandbox = Sandbox(SandboxConfig(cgroups=False, memory_bytes=MEMORY_LIMIT, timeout_s=30, tmp_bytes=TMP_BYTES))
    rows = []
    with tempfile.TemporaryDirectory(prefix="taskrl-bounds-") as root:
        ws = Path(root)
        os.chmod(ws, 0o777)
        share = int(0.45 * MEMORY_LIMIT)  # three of them: 1.35x the limit together, each well under it
        three = " & ".join([HOG.format(n=share)] * 3) + " & wait"
        result, seen = await measure(sandbox, three, root)
        rows.append(Row("memory: 3 processes x 0.45 limit", MEMORY_LIMIT, seen.peak_memory, result.peak_memory_bytes,
                        result.killed))  # fmt: skip
        tmpfs = ("head -c 200000000 /dev/zero > /dev/shm/a; head -c 200000000 /dev/zero > /tmp/b; "
                 + HOG.format(n=int(0.3 * MEMORY_LIMIT)))  # fmt: skip
        result, seen = await measure(sandbox, tmpfs, root)
        rows.append(Row("memory: /dev/shm + /tmp + 1 process", MEMORY_LIMIT, seen.peak_memory,
                        result.peak_memory_bytes, result.killed))  # fmt: skip
        result, seen = await measure(sandbox, "head -c 300000000 /dev/zero > big", root, disk_quota=DISK_QUOTA)
        rows.append(Row("disk: one 300 MB file", DISK_QUOTA, seen.peak_disk, result.peak_disk_bytes, result.killed))
        for name in os.listdir(root):
            os.unlink(ws / name)
        writers = " & ".join(f"head -c 40000000 /dev/zero > w{i}" for i in range(8)) + " & wait"
        result, seen = await measure(sandbox, writers, root, disk_quota=DISK_QUOTA)
        rows.append(Row("disk: 8 parallel 40 MB files", DISK_QUOTA, seen.peak_disk, result.peak_disk_bytes,
                        result.killed))  # fmt: skip
    return rows


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: the host-side sampler finds the sandbox's processes by their host uid")
    print(f"CPU: {cpu_model()}")
    print("## Reliability: sandbox bounds (no cgroup: SandboxConfig(cgroups=False))")
    print("| scenario | limit MiB | host-measured peak MiB | watchdog peak MiB | peak/limit | stopped by |")
    print("|---|---|---|---|---|---|")
    for row in asyncio.run(scenarios()):
        print(row.line())


if __name__ == "__main__":
    main()

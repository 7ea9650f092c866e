"""Workspaces and sandbox of the code env, against their plain baselines measured in the same run.

* Workspaces created per second from a 1,000-file repository: copy-on-write (overlay where it works here,
  hardlink as root, copy: what non-root users get since issue 19) vs ``shutil.copytree``. Targets (issue 6):
  ratio >= 10x and >= 200 workspaces/s.
* Warm pool: latency of ``acquire()`` when the pool is warm.
* Snapshot / restore latency of a workspace with 20 changed files.
* Sandboxed ``true`` (bubblewrap, rlimits, per-sandbox cgroups, unprivileged uid) p50 vs a bare ``/bin/true``
  subprocess. Target: <= 20 ms.
* What the walked disk quota of hardlink/copy workspaces costs a command, on copy workspaces of ``--quota-files``
  files each: a sandboxed ``true`` without a quota; with it as the code tools ran it before (the sandbox walks the
  tree at the start for its growth meter, ``quota_note()`` walks it after); and as they run it now (the watchdog
  starts from the reading the workspace keeps, ``disk_growth=ws.disk_growth()``: only ``quota_note()`` walks).

    .venv/bin/python benchmarks/workspace_bench.py [--files 1000] [--clones 200] [--commands 100] \
        [--quota-files 1000 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from taskrl.envs.code.sandbox import Sandbox, SandboxConfig
from taskrl.envs.code.trees import tree_bytes
from taskrl.envs.code.workspace import BaseTree, Workspace, WorkspaceConfig, WorkspacePool, overlay_available


def make_repo(root: Path, files: int) -> Path:
    """A repository of ``files`` Python files of ~2 KB in 50 packages."""
    repo = root / "repo"
    per_dir = max(1, files // 50)
    for i in range(files):
        pkg = repo / f"pkg{i // per_dir:02d}"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / f"mod{i % per_dir:03d}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 50)
    return repo


def clone_rate(create, destroy, n: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(workspaces created per second, ms to destroy one); creation timed alone."""
    start = time.perf_counter()
    made = [create(i) for i in range(n)]
    created = time.perf_counter() - start
    start = time.perf_counter()
    for item in made:
        destroy(item)
    return n / created, (time.perf_counter() - start) / n * 1e3


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


async def command_latency(sandbox: Sandbox, workspace: Path, n: int) -> tuple[float, float]:
    """p50 of a sandboxed `true` and of a bare `/bin/true` subprocess, interleaved."""
    sandboxed, bare = [], []
    for _ in range(n):
        start = time.perf_counter()
        await sandbox.run(["true"], workspace)
        sandboxed.append(time.perf_counter() - start)
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec("/bin/true", cwd=workspace)
        await proc.wait()
        bare.append(time.perf_counter() - start)
    return p50_ms(sandboxed), p50_ms(bare)


async def quota_latency(sandbox: Sandbox, ws: Workspace, n: int) -> tuple[float, float, float, float]:
    """p50 ms of a sandboxed `true` without a quota, with the quota walked at the start and after (before), and
    with the kept reading as the watchdog's start and one walk after (now), interleaved; and of one walk."""
    plain, before, now, walks = [], [], [], []
    for _ in range(n):
        start = time.perf_counter()
        await sandbox.run(["true"], ws.path)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        await sandbox.run(["true"], ws.path, disk_quota_bytes=ws.disk_budget())
        ws.quota_note()
        before.append(time.perf_counter() - start)
        start = time.perf_counter()
        await sandbox.run(["true"], ws.path, disk_quota_bytes=ws.disk_budget(), disk_growth=ws.disk_growth())
        ws.quota_note()
        now.append(time.perf_counter() - start)
        start = time.perf_counter()
        tree_bytes(ws.path)
        walks.append(time.perf_counter() - start)
    return p50_ms(plain), p50_ms(before), p50_ms(now), p50_ms(walks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--clones", type=int, default=200)
    parser.add_argument("--commands", type=int, default=100)
    parser.add_argument("--quota-files", type=int, nargs="*", default=[1000, 20000],
                        help="sizes of the copy workspaces the walked quota is timed on")  # fmt: skip
    args = parser.parse_args()
    # a `timeout` or a kill must still unmount and remove the benchmark's workspaces (finally, atexit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    print(f"CPU: {model}; amx_bf16: {'amx_bf16' in cpu}; load average: {os.getloadavg()[0]:.1f}")
    tmp = Path(tempfile.mkdtemp(prefix="taskrl-wsbench-"))
    tmp.chmod(0o755)  # as root the sandbox runs as an unprivileged uid that must reach the workspaces
    try:
        repo = make_repo(tmp, args.files)
        root = tmp / "workspaces"
        modes = (["overlay"] if overlay_available(tmp) else []) + (["hardlink"] if os.geteuid() == 0 else [])
        modes.append("copy")
        copies = max(10, args.clones // 10)
        counter = iter(range(10**9))
        copy_rate, copy_destroy = clone_rate(
            lambda i: shutil.copytree(repo, tmp / f"copy{next(counter)}"), shutil.rmtree, copies
        )
        print(f"repository: {args.files} files; baseline shutil.copytree: {copy_rate:.1f} workspaces/s "
              f"({copies} copies, rmtree {copy_destroy:.1f} ms)")  # fmt: skip
        print("| mode | workspaces/s | vs copytree | destroy ms | warm acquire p50 ms | snapshot p50 ms "
              "| restore p50 ms |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        sandbox_ws = None
        for mode in modes:
            pool = WorkspacePool(BaseTree(repo), WorkspaceConfig(root=str(root), mode=mode, pool_size=0))
            clones = copies if mode == "copy" else args.clones  # a full copy is as slow as copytree
            rate, destroy_ms = clone_rate(lambda i, p=pool: p.create(), lambda ws: ws.destroy(), clones)
            warm_pool = WorkspacePool(BaseTree(repo), WorkspaceConfig(root=str(root), mode=mode, pool_size=4))
            acquires = []
            for _ in range(20):
                while len(warm_pool._ready) < 4:  # let the background thread refill it
                    time.sleep(0.001)
                start = time.perf_counter()
                taken = warm_pool.acquire()
                acquires.append(time.perf_counter() - start)
                taken.destroy()
            warm_pool.close()
            ws = pool.create()
            for i in range(20):
                ws.write_file(f"pkg{i:02d}/mod000.py", b"changed\n")
            snaps, restores = [], []
            for i in range(20):
                start = time.perf_counter()
                ws.snapshot(f"s{i}")
                snaps.append(time.perf_counter() - start)
                ws.write_file("pkg00/mod001.py", b"after the snapshot\n")
                start = time.perf_counter()
                ws.restore(f"s{i}")
                restores.append(time.perf_counter() - start)
            if sandbox_ws is None:
                sandbox_ws = ws
            else:
                ws.destroy()
            print(f"| {mode} | {rate:.0f} | {rate / copy_rate:.1f}x | {destroy_ms:.2f} | "
                  f"{p50_ms(acquires):.3f} | {p50_ms(snaps):.2f} | {p50_ms(restores):.2f} |")  # fmt: skip
        sandbox = Sandbox(SandboxConfig())
        boxed, bare = asyncio.run(command_latency(sandbox, sandbox_ws.path, args.commands))  # type: ignore[union-attr]
        print(f"sandboxed `true` p50: {boxed:.1f} ms vs bare subprocess {bare:.1f} ms ({boxed / bare:.1f}x; "
              f"process limit: {sandbox.process_limit}; {args.commands} runs)")  # fmt: skip
        print(f"limits: {getattr(sandbox, 'limits', sandbox.process_limit)}")
        sandbox_ws.destroy()  # type: ignore[union-attr]
        if args.quota_files:
            print("| copy workspace files | sandboxed `true` p50 ms | quota, walked before and after p50 ms | ratio "
                  "| quota, kept reading + walk after p50 ms | ratio | one walk p50 ms |")  # fmt: skip
            print("|---:|---:|---:|---:|---:|---:|---:|")
        for files in args.quota_files:
            big = make_repo(tmp / f"quota{files}", files)
            pool = WorkspacePool(BaseTree(big), WorkspaceConfig(root=str(root), mode="copy", pool_size=0))
            ws = pool.create()
            n = max(10, args.commands // 2)
            plain, before, now, walk = asyncio.run(quota_latency(sandbox, ws, n))
            print(f"| {files} | {plain:.1f} | {before:.1f} | {before / plain:.2f}x | {now:.1f} | {now / plain:.2f}x "
                  f"| {walk:.1f} |")  # fmt: skip
            ws.destroy()
            pool.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Whole-sandbox bounds where no cgroup holds them (issue 37): the memory of all a sandbox's processes and of its
private tmpfs together, and the workspace's disk for the whole episode; each kill names the mechanism."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from taskrl.envs.code import limits
from taskrl.envs.code.sandbox import Sandbox, SandboxConfig, host_uid
from taskrl.envs.code.workspace import BaseTree, WorkspaceConfig, WorkspacePool

MIB = 1 << 20
LIMIT = 384 * MIB
HOG = "python -c \"import time; b = bytearray({n}); b[::4096] = b'x' * len(b[::4096]); time.sleep(8)\""
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def no_cgroup() -> Sandbox:
    """A real bubblewrap sandbox holding its limits as on a machine that delegates no cgroup."""
    return Sandbox(SandboxConfig(cgroups=False, memory_bytes=LIMIT, tmp_bytes=160 * MIB, timeout_s=20,
                                 max_file_bytes=256 * MIB))  # fmt: skip


@pytest.fixture
def workspace(agent_tmp: Path) -> Path:
    ws = agent_tmp / "ws"
    ws.mkdir()
    os.chown(ws, host_uid(), host_uid())
    return ws


def test_the_fallback_names_its_mechanisms(no_cgroup: Sandbox) -> None:
    held = no_cgroup.mechanisms("the disk's")
    assert held["memory"] == limits.MEMORY_MECHANISM and held["processes"] == "RLIMIT_NPROC"
    assert held["disk"] == "the disk's" and "cgroups off" in no_cgroup.limits


async def test_three_processes_sharing_out_more_than_the_limit_are_killed(no_cgroup: Sandbox, workspace: Path) -> None:
    share = int(0.45 * LIMIT)  # each one far under the limit (and its RLIMIT_AS); 1.35x the limit together
    result = await no_cgroup.run(" & ".join([HOG.format(n=share)] * 3) + " & wait", workspace)
    assert result.killed is not None and result.killed.startswith("memory limit"), result
    assert limits.MEMORY_MECHANISM in result.killed  # the mechanism that held it is named
    # killed while they held it, well before all three had their share (1.35x): the sampling caught the crossing
    assert result.peak_memory_bytes is not None and LIMIT < result.peak_memory_bytes < 1.3 * LIMIT, result
    assert result.duration_s < 8, "killed at the limit, not at the end of the command"


async def test_memory_held_in_the_sandboxs_tmpfs_counts(no_cgroup: Sandbox, workspace: Path) -> None:
    # 150 MB in /dev/shm and 150 MB in /tmp are in no process's RSS; with a 120 MB process: over 384 MiB
    fill = "head -c 150000000 /dev/zero > /dev/shm/a && head -c 150000000 /dev/zero > /tmp/b && "
    result = await no_cgroup.run(fill + HOG.format(n=120 * MIB), workspace)
    assert result.killed is not None and result.killed.startswith("memory limit"), result
    assert "/tmp and /dev/shm" in result.killed
    calm = await no_cgroup.run(fill + "echo fits", workspace)  # the tmpfs alone stays under the limit
    assert calm.ok and calm.stdout == "fits\n", calm


async def test_one_command_writing_past_the_disk_bound_is_stopped(no_cgroup: Sandbox, workspace: Path) -> None:
    quota = 48 * MIB
    one = await no_cgroup.run("head -c 300000000 /dev/zero > big; echo after", workspace, disk_quota_bytes=quota)
    # stopped at the quota: by RLIMIT_FSIZE at the remaining quota (head dies of SIGXFSZ, the shell goes on), or by
    # the watchdog (the whole command killed), whichever comes first
    by_rlimit = "File size limit exceeded" in one.stderr and one.stdout == "after\n"
    assert by_rlimit or (one.killed is not None and "disk quota" in one.killed), one
    assert (workspace / "big").stat().st_size <= quota
    (workspace / "big").unlink()
    # eight writers at once: RLIMIT_FSIZE holds each file, not their sum; the watchdog holds the sum. Sampling, it
    # lets through what they write in one gap between samples (tens of MiB on a loaded 2-core machine, where zeros
    # reach the page cache at GB/s): the bound asserted is "stopped mid-flood", not a timing
    intended = 8 * 60_000_000
    writers = " & ".join(f"head -c {intended // 8} /dev/zero > w{i}" for i in range(8)) + " & wait"
    many = await no_cgroup.run(writers, workspace, disk_quota_bytes=quota)
    assert many.killed is not None and "disk quota" in many.killed and limits.DISK_MECHANISM in many.killed, many
    written = sum(p.stat().st_size for p in workspace.glob("w*"))
    assert written < intended // 2, written >> 20


async def test_another_writer_on_the_same_disk_does_not_count_against_the_command(
    no_cgroup: Sandbox, workspace: Path
) -> None:
    # The watchdog screens the file system's free space, which every writer shares: a checkpoint or another
    # workspace filling the disk while a command runs got the innocent command killed for "disk quota" (it
    # flaked the suite under xdist). Only what the command's own workspace gained may count.
    other = workspace.parent / "other-writer"
    other.mkdir()
    running = asyncio.ensure_future(no_cgroup.run("sleep 2; echo done", workspace, disk_quota_bytes=16 * MIB))
    await asyncio.sleep(0.6)  # the command is running, its watchdog sampling
    await asyncio.to_thread((other / "checkpoint").write_bytes, os.urandom(96 * MIB))
    result = await running
    assert result.ok and result.stdout == "done\n", result
    # and the command's own writes still count, however the rest of the disk moves: six 10 MB files, each under
    # RLIMIT_FSIZE, paced so the command is still running when the watchdog confirms the sum past the quota
    paced = "for i in 1 2 3 4 5 6; do head -c 10000000 /dev/zero > w$i; sleep 0.3; done; echo survived"
    own = await no_cgroup.run(paced, workspace, disk_quota_bytes=16 * MIB)
    assert own.killed is not None and "disk quota" in own.killed and "survived" not in own.stdout, own


async def test_writes_hidden_in_an_unreadable_directory_still_count(no_cgroup: Sandbox, workspace: Path) -> None:
    # the growth that confirms a kill is a walk of the workspace: a directory the walk may not read is no hiding
    # place (the free-space reading stands when the tree cannot be measured)
    # (files opened before the chmod, then written through their descriptors, paced as above)
    hide = ("mkdir d && exec 3>d/a 4>d/b 5>d/c 6>d/e 7>d/f 8>d/g && chmod 000 d && "
            "for fd in 3 4 5 6 7 8; do head -c 10000000 /dev/zero >&$fd; sleep 0.3; done; echo survived")  # fmt: skip
    result = await no_cgroup.run(hide, workspace, disk_quota_bytes=16 * MIB)
    (workspace / "d").chmod(0o755)
    assert result.killed is not None and "disk quota" in result.killed and "survived" not in result.stdout, result


@pytest.mark.parametrize("mode", ["copy", *(["hardlink"] if ROOT else [])])
async def test_repeated_writes_share_one_bound_per_episode(no_cgroup: Sandbox, base_tree: Path, mode: str,
                                                           workspace_config: WorkspaceConfig) -> None:  # fmt: skip
    quota = 64 * MIB  # the watchdog reads the file system's free space: room for other writers on a shared disk
    config = WorkspaceConfig(root=workspace_config.root, mode=mode, pool_size=0, disk_quota_bytes=quota)
    pool = WorkspacePool(BaseTree(base_tree), config)
    ws = pool.acquire()
    try:
        assert "per episode" in ws.disk_mechanism()
        # a hard link to the agent's own file does not hide it from the quota (it did: nlink > 1 counted 0)
        first = await no_cgroup.run("head -c 30000000 /dev/zero > a && ln a b", ws.path,
                                    disk_quota_bytes=ws.disk_budget())  # fmt: skip
        assert first.ok, first
        assert ws.disk_usage() >= 28 * MIB and ws.disk_budget() <= 36 * MIB  # type: ignore[operator]
        ws.write_file("notes.txt", b"n" * (3 * MIB))  # a host-side write between commands: kept in the reading
        for _ in range(2):  # the next commands get only what is left, however often they try
            # as the code tools run it: the kept reading is the watchdog's start, no walk before the command
            again = await no_cgroup.run("head -c 60000000 /dev/zero > c$RANDOM", ws.path,
                                        disk_quota_bytes=ws.disk_budget(), disk_growth=ws.disk_growth())  # fmt: skip
            assert again.killed is not None or "File size limit exceeded" in again.stderr, again
            assert ws.disk_usage() <= quota + 2 * MIB
    finally:
        ws.destroy()
        pool.close()


@pytest.mark.parametrize("mode", ["copy", *(["overlay"] if ROOT else [])])
async def test_the_episode_info_names_the_mechanism_of_each_limit(workspace_config: WorkspaceConfig, mode: str) -> None:
    from taskrl.envs.code.env import CodeEnvConfig, HumanEvalEnv

    workspace = WorkspaceConfig(root=workspace_config.root, mode=mode, pool_size=0, disk_quota_bytes=32 * MIB)
    env = HumanEvalEnv(CodeEnvConfig(sandbox=SandboxConfig(cgroups=False), workspace=workspace))
    try:
        _, info = await env.reset(env.tasks("all")[0])
    finally:
        env.close()
    held = info["limits"]
    assert held["memory"] == limits.MEMORY_MECHANISM and held["processes"] == "RLIMIT_NPROC"
    expected = "size-capped tmpfs" if info["workspace_mode"] == "overlay" else limits.DISK_MECHANISM
    assert expected in held["disk"] and "32 MiB" in held["disk"], held

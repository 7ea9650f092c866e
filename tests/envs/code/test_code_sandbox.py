"""Security tests: every escape attempt is contained and reported, the host is untouched, the sandbox goes on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from taskrl.envs.code.sandbox import CommandResult, Sandbox, SandboxConfig, SandboxUnavailableError, host_uid


@pytest.fixture
def workspace(agent_tmp: Path) -> Path:
    ws = agent_tmp / "ws"
    ws.mkdir()
    (ws / "hello.txt").write_text("hello\n")
    uid = host_uid()
    for path in (ws, ws / "hello.txt"):
        os.chown(path, uid, uid)
    return ws


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host file outside the workspace that no sandboxed command may see or change."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text("top secret\n")
    return path


async def still_works(sandbox: Sandbox, workspace: Path) -> None:
    """After an attack the next command runs normally (the episode goes on)."""
    result = await sandbox.run("cat hello.txt", workspace)
    assert result.ok and result.stdout == "hello\n"


async def test_runs_the_venv_python_and_pytest_inside(sandbox: Sandbox, workspace: Path) -> None:
    result = await sandbox.run("id -u; pwd; python -c 'import pytest, coverage; print(pytest.__name__)'", workspace)
    assert result.ok, result.format()
    assert result.stdout.split() == ["1000", "/workspace", "pytest"]


async def test_reading_outside_the_workspace_is_contained(sandbox: Sandbox, workspace: Path, canary: Path) -> None:
    host_file = Path(__file__).resolve()  # exists on the host, outside anything the sandbox binds
    result = await sandbox.run(f"cat /etc/shadow; cat {canary}; cat ../outside/secret.txt; cat {host_file}", workspace)
    assert "top secret" not in result.stdout
    assert result.stderr.count("No such file or directory") == 4, result.format()
    passwd = await sandbox.run("cat /etc/passwd", workspace)
    assert passwd.stdout.startswith("agent:x:1000") and "root:" not in passwd.stdout  # not the host's
    await still_works(sandbox, workspace)


async def test_writing_outside_the_workspace_fails_and_the_host_is_untouched(
    sandbox: Sandbox, workspace: Path, canary: Path
) -> None:
    attack = (
        f"echo x > /usr/evil; echo x > /etc/evil; echo x > {canary}; rm -rf /usr/bin 2>&1 | head -1; echo ok > mine.txt"
    )
    result = await sandbox.run(attack, workspace)
    assert result.stderr.count("Read-only file system") == 2, result.format()  # /usr and the sandbox's own /etc
    assert "Read-only file system" in result.stdout  # rm -rf /usr/bin
    assert canary.read_text() == "top secret\n"
    assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists() and Path("/usr/bin/true").exists()
    assert (workspace / "mine.txt").read_text() == "ok\n"  # the workspace itself is writable
    await still_works(sandbox, workspace)


async def test_no_network_not_even_the_hosts_loopback(sandbox: Sandbox, workspace: Path) -> None:
    connected: list[bool] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.append(True)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (
        "import socket\n"
        f"for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 53)):\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    try:\n        s.connect((host, port)); print('CONNECTED', host)\n"
        "    except OSError as e:\n        print('blocked', host, e.errno)\n"
    )
    async with server:
        result = await sandbox.run(["python", "-c", probe], workspace)
    assert "CONNECTED" not in result.stdout and result.stdout.count("blocked") == 2, result.format()
    assert connected == []


async def test_fork_bomb_is_capped_and_killed(sandbox: Sandbox, workspace: Path) -> None:
    counter = (
        "import os, time\nn = 0\nfor _ in range(500):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30); os._exit(0)\n    n += 1\n"
        "print(n)\n"
    )
    result = await sandbox.run(["python", "-c", counter], workspace)
    assert 0 < int(result.stdout) < sandbox.config.max_processes, result.format()  # fork failed at the cap
    assert result.duration_s < 10  # the sleeping children died with the command
    bomb = await sandbox.run(["bash", "-c", ":(){ :|:& };: ; sleep 30"], workspace, timeout_s=2)
    assert bomb.killed is not None and "wall timeout" in bomb.killed
    deadline = time.monotonic() + 5
    while [p for p in Path("/sys/fs/cgroup/pids").glob(f"taskrl-{os.getpid()}-*")] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not [p for p in Path("/sys/fs/cgroup/pids").glob(f"taskrl-{os.getpid()}-*")]  # every cgroup removed
    await still_works(sandbox, workspace)


async def test_infinite_loop_hits_the_cpu_limit(sandbox: Sandbox, workspace: Path) -> None:
    result = await sandbox.run(["python", "-c", "while True: pass"], workspace)
    assert result.killed in ("CPU time limit exceeded", f"wall timeout: killed after {sandbox.config.timeout_s:g}s")
    assert result.returncode == 128 + signal.SIGXCPU or "wall timeout" in result.killed
    await still_works(sandbox, workspace)


async def test_a_command_that_hangs_is_killed_at_the_wall_timeout(sandbox: Sandbox, workspace: Path) -> None:
    start = time.perf_counter()
    result = await sandbox.run("sleep 60", workspace, timeout_s=1)
    assert result.killed == "wall timeout: killed after 1s" and result.returncode == 137
    assert time.perf_counter() - start < 5


async def test_a_gigabyte_of_output_is_capped_with_a_marker(sandbox: Sandbox, workspace: Path) -> None:
    result = await sandbox.run("head -c 1000000000 /dev/zero | tr '\\0' x", workspace)
    assert result.killed is not None and result.killed.startswith("output limit")
    assert result.truncated and "[... output truncated:" in result.stdout
    assert len(result.stdout) < 5000
    big_file = await sandbox.run("head -c 1000000000 /dev/zero > big.bin", workspace)
    assert big_file.killed == "file size limit exceeded" or "File too large" in big_file.stderr, big_file.format()
    assert (workspace / "big.bin").stat().st_size <= sandbox.config.max_file_bytes
    await still_works(sandbox, workspace)


async def test_memory_limit(sandbox: Sandbox, workspace: Path) -> None:
    result = await sandbox.run(["python", "-c", "b = bytearray(3 << 30)"], workspace)
    assert result.returncode != 0 and "MemoryError" in result.stderr


async def test_a_symlink_pointing_out_resolves_inside_the_sandbox(
    sandbox: Sandbox, workspace: Path, canary: Path
) -> None:
    result = await sandbox.run(f"ln -s {canary} leak && cat leak; ln -s /etc/shadow shadow && cat shadow", workspace)
    assert "top secret" not in result.stdout and result.stderr.count("No such file") == 2, result.format()
    assert os.readlink(workspace / "leak") == str(canary)  # the link exists on the host, but nothing followed it


async def test_background_jobs_end_with_the_command(sandbox: Sandbox, workspace: Path) -> None:
    start = time.perf_counter()
    result = await sandbox.run("sleep 100 & echo started", workspace)
    assert result.ok and result.stdout == "started\n"
    assert time.perf_counter() - start < 4


async def test_output_is_capped_per_stream_with_a_visible_marker(sandbox: Sandbox, workspace: Path) -> None:
    result = await sandbox.run("python -c \"print('a' * 9999)\"", workspace)
    assert result.ok and result.truncated and result.killed is None
    assert result.stdout == "a" * 4000 + "\n[... output truncated: 6000 more bytes ...]"


def test_missing_bubblewrap_is_a_clear_error() -> None:
    with pytest.raises(
        SandboxUnavailableError, match=r"not installed: install it with `make sysdeps`.*unsafe_no_sandbox"
    ):
        Sandbox(SandboxConfig(bwrap="bwrap-is-not-installed"))


async def test_unsafe_mode_must_be_asked_for_and_still_limits(workspace: Path) -> None:
    unsafe = Sandbox(SandboxConfig(bwrap="bwrap-is-not-installed", unsafe_no_sandbox=True, timeout_s=1))
    assert not unsafe.isolated and unsafe.workdir(workspace) == str(workspace)
    result = await unsafe.run("pwd; sleep 30", workspace)
    assert result.stdout.strip() == str(workspace) and result.killed == "wall timeout: killed after 1s"


@pytest.mark.parametrize(
    ("field", "value"), [("timeout_s", 0), ("cpu_seconds", 0), ("max_processes", -1), ("max_output_bytes", -1)]
)
def test_config_errors_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"SandboxConfig.{field}"):
        SandboxConfig(**{field: value})


def test_command_result_format() -> None:
    result = CommandResult(returncode=1, stdout="out\n", stderr="err\n", duration_s=0.1, killed="wall timeout")
    assert result.format() == "exit code 1 (wall timeout)\n[stdout]\nout\n[stderr]\nerr"
    assert not result.ok


async def test_a_process_the_kernel_kills_at_the_memory_limit_is_noted_not_a_kill(
    sandbox: Sandbox, workspace: Path
) -> None:
    """The cgroup's OOM killer ends one process; the command itself lives on and exits 0 by itself."""
    if "memory: cgroup" not in sandbox.limits:
        pytest.skip(f"no memory cgroup here: {sandbox.limits}")
    hog = f"python -c \"import time; b = b'x' * ({sandbox.config.memory_bytes // 2 + (64 << 20)}); time.sleep(2)\""
    result = await sandbox.run(["sh", "-c", f"{hog} & {hog} & {hog} & wait; echo survived"], workspace, timeout_s=30)
    assert result.killed is None and result.returncode == 0 and "survived" in result.stdout, result
    assert result.note is not None and result.note.startswith("memory limit"), result
    assert result.format().startswith("exit code 0 [memory limit"), result.format()


async def test_the_process_cap_holds_for_the_whole_sandbox(sandbox: Sandbox, workspace: Path) -> None:
    """Issue 19: limits were per process. Three forkers in one command share one cap."""
    counter = (
        "import os, time\nn = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30); os._exit(0)\n    n += 1\n"
        "print(n, flush=True)\ntime.sleep(1)\n"
    )
    forker = f"python -c '{counter}'"
    result = await sandbox.run(["sh", "-c", f"{forker} & {forker} & {forker} & wait"], workspace, timeout_s=30)
    counts = [int(n) for n in result.stdout.split()]
    assert len(counts) == 3 and sum(counts) + 4 <= sandbox.config.max_processes, result.format()  # + sh, 3 pythons
    await still_works(sandbox, workspace)


async def test_the_cpu_share_holds_for_the_whole_sandbox(small_limits: SandboxConfig, workspace: Path) -> None:
    """Two busy processes in a sandbox limited to a quarter of a CPU: both are in one cgroup with that quota, and
    together they get about a quarter of a CPU (an idle machine would give them 1.5-4 CPU-seconds in 2 s)."""
    sandbox = Sandbox(SandboxConfig(**{**small_limits.__dict__, "cpus": 0.25}))
    held = {name: how for part in sandbox.limits.split("; ") for names, how in [part.split(": ", 1)]
            for name in names.split(", ")}  # fmt: skip
    if not held.get("cpu", "").startswith("cgroup"):
        pytest.skip(f"no cpu cgroup here: {sandbox.limits}")
    hierarchy = Path(held["cpu"].split(" under ", 1)[1])
    busy = "python -c 'import time\nend = time.time() + 2\nwhile time.time() < end: pass\nprint(time.process_time())'"
    running = asyncio.ensure_future(sandbox.run(["sh", "-c", f"{busy} & {busy} & wait"], workspace, timeout_s=30))
    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + 10
    while not running.done() and time.monotonic() < deadline:
        with contextlib.suppress(OSError):  # a cgroup can go between the glob and the read
            live = [(g, (g / "cgroup.procs").read_text().split()) for g in hierarchy.glob(f"taskrl-{os.getpid()}-*")]
            live = [(g, procs) for g, procs in live if procs]  # earlier commands' cgroups may await removal
            if len(live) == 1:
                group, procs = live[0]
                quota = group / ("cpu.max" if (group / "cpu.max").exists() else "cpu.cfs_quota_us")
                seen.append((quota.read_text().split()[0], len(procs)))
        await asyncio.sleep(0.1)
    result = await running
    used = [float(x) for x in result.stdout.split()]
    assert len(used) == 2 and sum(used) < 1.0, result.format()
    assert seen and {quota for quota, _ in seen} == {"25000"}, seen  # 0.25 of a 100 ms period
    assert max(procs for _, procs in seen) >= 3, seen  # sh and both pythons in the one cgroup

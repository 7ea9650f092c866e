"""The sandbox every agent command runs in: bubblewrap namespaces, an unprivileged uid, limits, output caps.

``Sandbox(SandboxConfig()).run("pytest -q", workspace)`` runs a command with no network, a read-only
system (``/usr``, the Python prefixes, a few ``/etc`` files, ``/proc/sys``; no ``/sys``), only the workspace
(mounted at ``/workspace``) and a small ``/tmp`` and ``/dev/shm`` writable, as an unprivileged host uid even
when taskrl runs as root (``setpriv`` drops to ``SANDBOX_HOST_UID`` before bubblewrap starts), one cgroup per
command for memory, pids and CPU where this machine delegates them (else rlimits plus a watchdog over the
whole process tree: see ``limits.py``), a wall timeout that kills the whole tree, and stdout/stderr capped
with a visible marker. Missing bubblewrap is a ``SandboxUnavailableError``; ``unsafe_no_sandbox=True`` runs
commands without isolation, and only when asked for explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from taskrl.envs.code import limits
from taskrl.envs.code.hostview import (
    _SYSTEM_DIRS,
    SANDBOX_UID,
    _answer_packages,
    _empty_dir,
    _identity_dir,
    _python_binds,
    _system_args,
    reachable_path,
    sandbox_path,
    sandbox_python,
)
from taskrl.envs.code.hostview import SANDBOX_HOST_UID as SANDBOX_HOST_UID  # re-exported: the sandbox's names
from taskrl.envs.code.hostview import SANDBOX_VENV as SANDBOX_VENV
from taskrl.envs.code.hostview import SandboxError as SandboxError
from taskrl.envs.code.hostview import SandboxUnavailableError as SandboxUnavailableError
from taskrl.envs.code.hostview import reachable_by as reachable_by
from taskrl.envs.code.limits import Cgroups, TreeWatchdog
from taskrl.envs.code.trees import tree_bytes
from taskrl.validate import above, require

SANDBOX_WORKDIR = "/workspace"
_PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/fs", "/proc/acpi", "/proc/scsi", "/proc/kcore")
_SH_IS_DASH = os.path.basename(os.path.realpath("/bin/sh")) == "dash"  # ulimit -f in 512-byte blocks, -p nproc
log = logging.getLogger(__name__)
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf")
_SIGNAL_REASONS = {
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
    signal.SIGKILL: "killed by SIGKILL (from outside the sandbox, or the kernel's OOM killer)",
    signal.SIGSEGV: "segmentation fault (possibly the memory limit)",
}


@dataclass
class SandboxConfig:
    """Limits and isolation of sandboxed commands."""

    timeout_s: float = 60.0
    """Wall-clock limit of one command; past it the whole process tree is killed."""
    cpu_seconds: int = 60
    """RLIMIT_CPU of every process in the sandbox (SIGXCPU past it)."""
    memory_bytes: int = 4 << 30
    """Memory of the whole sandbox: a memory cgroup, else a watchdog over its processes' summed memory (PSS) plus
    what its /tmp and /dev/shm hold, sampled every 10 ms once half is used (``limits.TreeWatchdog``); also
    RLIMIT_AS of every process."""
    cpus: float = 1.0
    """CPU cores the sandbox may use at once (a cgroup CPU quota where one can be made)."""
    max_processes: int = 128
    """Processes and threads alive at once in one command (a fork bomb stops here)."""
    max_file_bytes: int = 256 << 20
    """RLIMIT_FSIZE: the largest file a command may write (SIGXFSZ past it)."""
    tmp_bytes: int = 256 << 20
    """Size of the sandbox's private /tmp and of its /dev/shm (tmpfs each, counted against memory)."""
    max_output_bytes: int = 16_000
    """Bytes of stdout and of stderr kept per command; the rest is dropped behind a visible marker."""
    kill_output_bytes: int = 8 << 20
    """A command that writes more than this (stdout + stderr) is killed: nobody reads a gigabyte of logs."""
    unsafe_no_sandbox: bool = False
    """Run commands without bubblewrap (no namespaces; rlimits, timeout and output caps still apply)."""
    bwrap: str = "bwrap"
    """The bubblewrap executable (a name on PATH or a path)."""
    cgroups: bool = True
    """Use the cgroups this machine delegates; False holds every limit with the fallbacks (rlimits and the
    watchdog), as on a machine that delegates none (tests and benchmarks of the fallback)."""
    ro_binds: tuple[str, ...] = ()
    """Extra host paths bound read-only at the same place (datasets, toolchains)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for sandboxed commands."""

    def __post_init__(self) -> None:
        require("SandboxConfig", "must be > 0", above(0), timeout_s=self.timeout_s, cpu_seconds=self.cpu_seconds,
                memory_bytes=self.memory_bytes, cpus=self.cpus, max_processes=self.max_processes,
                max_file_bytes=self.max_file_bytes, tmp_bytes=self.tmp_bytes)  # fmt: skip
        if self.max_output_bytes < 0:
            raise ValueError(f"SandboxConfig.max_output_bytes must be >= 0, got {self.max_output_bytes}")
        if self.kill_output_bytes < self.max_output_bytes:
            raise ValueError(
                f"SandboxConfig.kill_output_bytes ({self.kill_output_bytes}) must be >= max_output_bytes "
                f"({self.max_output_bytes})"
            )
        for path in self.ro_binds:
            if not os.path.isabs(path):
                raise ValueError(f"SandboxConfig.ro_binds entries must be absolute paths, got {path!r}")


@dataclass(frozen=True)
class Bind:
    """A host path made visible inside the sandbox at ``target``."""

    host: str
    target: str
    writable: bool = False


@dataclass
class CommandResult:
    """What a sandboxed command did. ``killed`` says why it was stopped, if it was; ``note`` what a limit did
    to it without stopping it (e.g. the kernel killed one of its processes at the memory limit, and the
    command went on and exited by itself)."""

    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    killed: str | None = None
    truncated: bool = False
    note: str | None = None
    peak_memory_bytes: int | None = None
    """Highest memory the watchdog read for the sandbox (None where a cgroup held the limit)."""
    peak_disk_bytes: int | None = None
    """Most bytes of free space the command consumed, as the watchdog read it, or what its workspace gained
    where the watchdog confirmed a reading past the quota (None without a disk quota)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.killed is None

    def format(self) -> str:
        """The result as the model sees it: exit status, then the (capped) output of each stream."""
        head = f"exit code {self.returncode}" + (f" ({self.killed})" if self.killed else "")
        head += f" [{self.note}]" if self.note else ""
        parts = [head]
        if self.stdout:
            parts.append("[stdout]\n" + self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        return "\n".join(parts)


class _Capture:
    """Keeps the first ``keep`` bytes of a stream and counts the rest."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.chunks: list[bytes] = []
        self.kept = 0
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - self.kept
        if room > 0:
            self.chunks.append(data[:room])
            self.kept += min(room, len(data))

    def text(self) -> str:
        out = b"".join(self.chunks).decode("utf-8", errors="replace")
        dropped = self.total - self.kept
        return out + (f"\n[... output truncated: {dropped} more bytes ...]" if dropped else "")


def host_uid() -> int:
    """The host uid sandboxed commands run as: ``SANDBOX_HOST_UID`` when taskrl runs as root, else our own."""
    return SANDBOX_HOST_UID if os.geteuid() == 0 else os.getuid()


def _drop_privileges() -> list[str]:
    """The exec wrapper that makes bubblewrap (and all it starts) run as the unprivileged host uid."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxUnavailableError(
            "taskrl runs as root and needs setpriv (util-linux) to run sandboxed commands as an unprivileged uid"
        )
    uid = str(SANDBOX_HOST_UID)
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _user_processes(uid: int) -> int:
    """Processes this user runs now: RLIMIT_NPROC counts them all, so the sandbox's cap comes on top."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += entry.stat(follow_symlinks=False).st_uid == uid
    return count


_BWRAP_CHECKED: dict[str, str] = {}


def _check_bwrap(bwrap: str) -> str:
    """Resolve bwrap and prove once per process that it can build namespaces here."""
    if bwrap in _BWRAP_CHECKED:
        return _BWRAP_CHECKED[bwrap]
    path = shutil.which(bwrap)
    if path is None:
        raise SandboxUnavailableError(
            f"bubblewrap ('{bwrap}') is not installed: install it with `make sysdeps` or "
            "`apt-get install bubblewrap`, or pass unsafe_no_sandbox=True (CLI: --unsafe-no-sandbox) to run "
            "agent commands without isolation"
        )
    probe = [*_drop_privileges(), path, "--unshare-all", "--unshare-user", "--die-with-parent", *_system_args()]
    done = subprocess.run([*probe, "/bin/true"], capture_output=True, text=True, timeout=30, check=False, cwd="/")
    if done.returncode != 0:
        raise SandboxUnavailableError(
            f"bubblewrap cannot create a sandbox here as uid {host_uid()} "
            f"({done.stderr.strip() or f'exit {done.returncode}'}); enable unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) or pass "
            "unsafe_no_sandbox=True to run without isolation"
        )
    _BWRAP_CHECKED[bwrap] = path
    return path


async def _growth_meter(workspace: str) -> Callable[[], int | None]:
    """What ``workspace``'s tree gained since this call, as a reading for the watchdog (None: unmeasurable now,
    or at the start, e.g. a directory the host may not read)."""
    start = await asyncio.to_thread(tree_bytes, workspace)

    def gained() -> int | None:
        now = tree_bytes(workspace)
        return None if now is None or start is None else now - start

    return gained


async def _spawn(*argv: str, **kwargs: object) -> asyncio.subprocess.Process:
    """Start the sandbox's launcher; a host that cannot start it (no memory, no pids, no fds) is a ``SandboxError``."""
    try:
        return await asyncio.create_subprocess_exec(*argv, **kwargs)  # type: ignore[arg-type]
    except OSError as e:
        raise SandboxError(f"could not start the sandbox ({argv[0]}): {e}") from e


class Sandbox:
    """Runs commands in a workspace under the configured isolation. Safe to share between episodes."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.bwrap = None if self.config.unsafe_no_sandbox else _check_bwrap(self.config.bwrap)
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxUnavailableError("prlimit (util-linux) is not installed; it applies the sandbox's rlimits")
        self.prlimit = prlimit
        self._setpriv = _drop_privileges() if self.bwrap else []
        self._cgroups = (
            Cgroups.find()
            if self.config.cgroups
            else Cgroups([], {c: "cgroups off (SandboxConfig.cgroups)" for c in limits.CONTROLLERS})
        )
        self.limits = limits.describe_limits(self._cgroups)
        """Which mechanism holds each limit here (cgroup or fallback, and why)."""
        self.process_limit = "pids cgroup" if "pids" in self._cgroups.controllers else "RLIMIT_NPROC"
        log.info("sandbox limits: %s; commands run as host uid %d", self.limits, host_uid())
        self._static_args = self._build_static_args() if self.bwrap else []
        venv_bin = os.path.dirname(self.python)
        self._env = {
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "USER": "agent",
            "LOGNAME": "agent",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",  # keeps workspaces (and their snapshots) free of caches
            "PYTHONHASHSEED": "0",
            **self.config.env,
        }

    @property
    def isolated(self) -> bool:
        return self.bwrap is not None

    @property
    def python(self) -> str:
        """The path of this Python interpreter as sandboxed commands see it."""
        return sandbox_python() if self.isolated else sys.executable

    def visible_path(self, bind: Bind) -> str:
        """Where a bound host path appears to the command."""
        return bind.target if self.isolated else bind.host

    def workdir(self, workspace: str | os.PathLike[str]) -> str:
        """The workspace path as commands see it."""
        return SANDBOX_WORKDIR if self.isolated else str(workspace)

    def _build_static_args(self) -> list[str]:
        cfg = self.config
        args = [
            "--unshare-all",  # network, pid, ipc, uts, cgroup and user namespaces
            "--unshare-user",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--disable-userns",  # no nested namespaces from inside
            "--die-with-parent",
            "--new-session",  # no TIOCSTI into the caller's terminal
            "--hostname", "sandbox",
            *_system_args(),
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(cfg.tmp_bytes), "--tmpfs", "/tmp",
            "--size", str(cfg.tmp_bytes), "--tmpfs", "/dev/shm",
        ]  # fmt: skip
        for path in _PROC_READ_ONLY:  # kernel settings: never writable, whatever the uid maps to
            if os.path.exists(path):
                args += ["--ro-bind", path, path]
        for name in _ETC_FILES:
            if os.path.exists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        identity = _identity_dir()
        args += [
            "--ro-bind",
            str(identity / "passwd"),
            "/etc/passwd",
            "--ro-bind",
            str(identity / "group"),
            "/etc/group",
        ]
        binds = [*_python_binds(), *((path, path) for path in cfg.ro_binds)]
        for host, target in binds:
            args += ["--ro-bind", reachable_path(host), target]
        for path in _answer_packages():  # reference solutions: never importable or readable in the sandbox
            target = sandbox_path(path)
            if any(target.startswith(t.rstrip("/") + "/") for t in [*(t for _, t in binds), *_SYSTEM_DIRS]):
                args += ["--ro-bind", str(_empty_dir()), target]
        return args

    def _argv(self, command: Sequence[str], workspace: str, binds: Sequence[Bind]) -> list[str]:
        if not self.isolated:
            return list(command)
        argv = [self.bwrap, *self._static_args, "--bind", workspace, SANDBOX_WORKDIR]  # type: ignore[list-item]
        for b in binds:
            argv += ["--bind" if b.writable else "--ro-bind", b.host, b.target]
        # last: every mount point exists by now, and the sandbox's own root becomes read-only too
        return [*argv, "--remount-ro", "/", "--chdir", SANDBOX_WORKDIR, "--", *command]

    def mechanisms(self, disk_quota: str) -> dict[str, str]:
        """Which mechanism holds each whole-sandbox limit here (``memory``, ``processes``, ``cpu``, ``disk``), for
        an episode's info; ``disk_quota`` is the workspace's own (a size-capped mount, or the watchdog)."""
        controllers = self._cgroups.controllers
        version = {c: h.version for h in self._cgroups.hierarchies for c in h.controllers}
        return {
            "memory": f"cgroup v{version['memory']}" if "memory" in controllers else limits.MEMORY_MECHANISM,
            "processes": self.process_limit,
            "cpu": f"cgroup v{version['cpu']}" if "cpu" in controllers else "CPU-seconds watchdog + RLIMIT_CPU",
            "disk": disk_quota,
        }

    def _launcher(self, cgroups: list[Path], nproc: int | None, file_bytes: int) -> list[str]:
        """Exec wrappers that apply the limits before anything else runs. Not a preexec_fn: without one Python
        spawns with vfork, which stays fast in a large process (fork() of a process holding a model is slow)."""
        cfg = self.config
        rlimits = [
            self.prlimit,
            f"--cpu={cfg.cpu_seconds}:{cfg.cpu_seconds + 1}",
            f"--as={cfg.memory_bytes}",
            f"--fsize={file_bytes}",
            "--core=0",
            *([f"--nproc={nproc}"] if nproc is not None else []),
            "--",
            *self._setpriv,
        ]
        if not cgroups:
            return rlimits
        # the shell moves itself into the cgroups and only then execs, so no process starts outside them
        join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
        files = [str(c / "cgroup.procs") for c in cgroups]
        if not _SH_IS_DASH:
            return ["/bin/sh", "-c", join + 'exec "$@"', "sh", *files, "--", *rlimits]
        # dash's ulimit sets the rlimits in the same shell: one exec less than sh + prlimit on every command
        ulimits = (
            f"ulimit -S -t {cfg.cpu_seconds} && ulimit -H -t {cfg.cpu_seconds + 1} && "
            f"ulimit -v {cfg.memory_bytes // 1024} && ulimit -f {max(1, file_bytes // 512)} && ulimit -c 0"
            + (f" && ulimit -p {nproc}" if nproc is not None else "")
        )
        script = join + ulimits + ' || exit 125; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *files, "--", *self._setpriv]

    async def run(
        self,
        command: Sequence[str] | str,
        workspace: str | os.PathLike[str],
        *,
        binds: Sequence[Bind] = (),
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        disk_quota_bytes: int | None = None,
        disk_growth: Callable[[], int | None] | None = None,
        stdin_fd: int | None = None,
        stdout_fd: int | None = None,
        pass_fds: Sequence[int] = (),
    ) -> CommandResult:
        """Run ``command`` (argv, or a string for ``/bin/sh -c``) in ``workspace``. Never raises for what the
        command does: limits hit, timeouts and output floods are reported in the result.

        ``disk_quota_bytes``: what the command may still add to the workspace's file system (kills it past
        that; in the sandbox only what its workspace gained counts, not another writer's use of the disk).
        ``disk_growth``: that reading, where the caller keeps one (``Workspace.disk_growth``: what the tree gained
        since the measurement the quota came from); without it the tree is walked here once before the start.
        ``stdin_fd``/``stdout_fd`` connect the command to pipes instead of /dev/null and the capture, and
        ``pass_fds`` hands it more: all three are closed here once the command has started (this is how two
        sandboxes are wired together, see ``harness.py``).
        """
        cfg = self.config
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("empty command")
        timeout = cfg.timeout_s if timeout_s is None else timeout_s
        cgroups = self._cgroups.create(cfg.memory_bytes, cfg.max_processes, cfg.cpus)
        controllers = self._cgroups.controllers
        nproc = None if "pids" in controllers else cfg.max_processes + _user_processes(host_uid())
        # no one file may outgrow what is left of the quota: a hard bound between two watchdog samples
        file_bytes = (
            cfg.max_file_bytes if disk_quota_bytes is None else max(4096, min(cfg.max_file_bytes, disk_quota_bytes))
        )
        handed = [fd for fd in (stdin_fd, stdout_fd, *pass_fds) if fd is not None]
        written = None
        if disk_quota_bytes is not None and self.isolated:  # it can write nowhere else on the disk
            written = disk_growth or await _growth_meter(str(workspace))
        start = time.perf_counter()
        try:
            proc = await _spawn(
                *self._launcher(cgroups, nproc, file_bytes),
                *self._argv(argv, str(workspace), binds),
                stdin=asyncio.subprocess.DEVNULL if stdin_fd is None else stdin_fd,
                stdout=asyncio.subprocess.PIPE if stdout_fd is None else stdout_fd,
                stderr=asyncio.subprocess.PIPE,
                cwd=str(workspace),
                env={**self._env, **(env or {})},
                pass_fds=tuple(pass_fds),
                start_new_session=True,  # its own process group: one killpg stops the tree
            )
            for fd in handed:
                os.close(fd)
            handed = []
            watchdog = TreeWatchdog(
                proc.pid,
                memory_bytes=None if "memory" in controllers else cfg.memory_bytes,
                cpu_seconds=None if "memory" in controllers else float(cfg.cpu_seconds),
                disk_path=str(workspace),
                disk_bytes=disk_quota_bytes,
                tmpfs_mounts=("/tmp", "/dev/shm") if self.isolated else (),
                tmpfs_bytes=cfg.tmp_bytes,
                disk_written=written,
            )
            return await self._supervise(proc, cgroups, timeout, start, watchdog)
        finally:
            for fd in handed:
                with contextlib.suppress(OSError):
                    os.close(fd)
            for cgroup in cgroups:
                limits.remove(cgroup)

    async def _supervise(
        self,
        proc: asyncio.subprocess.Process,
        cgroups: list[Path],
        timeout: float,
        start: float,
        watchdog: TreeWatchdog,
    ) -> CommandResult:
        cfg = self.config
        out, err = _Capture(cfg.max_output_bytes), _Capture(cfg.max_output_bytes)
        killed: str | None = None

        def kill(reason: str) -> None:
            nonlocal killed
            killed = killed or reason
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            limits.kill_all(cgroups)

        async def pump(stream: asyncio.StreamReader | None, capture: _Capture) -> None:
            while stream is not None and (data := await stream.read(65536)):
                capture.add(data)
                if out.total + err.total > cfg.kill_output_bytes and killed is None:
                    kill(f"output limit: more than {cfg.kill_output_bytes} bytes written, command killed")

        async def watch() -> None:
            while True:
                await asyncio.sleep(watchdog.period())  # commands shorter than a period cost nothing
                broken = await asyncio.to_thread(watchdog.check)
                if broken is not None:
                    kill(broken)
                    return

        pumps = asyncio.ensure_future(asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err)))
        watcher = asyncio.ensure_future(watch()) if watchdog.needed else None
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            kill(f"wall timeout: killed after {timeout:g}s")
        except BaseException:  # cancelled (e.g. the tool's own timeout): never leave the tree running
            kill("cancelled")
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
            # Whatever the command left behind would hold the pipes open: end it too. In the sandbox the pid
            # namespace already ended it with the command; without one, only the group and cgroup reach it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if killed is not None or not self.isolated:
                limits.kill_all(cgroups)
            try:
                await asyncio.wait_for(asyncio.shield(pumps), 5.0)
            except TimeoutError:  # a process outside our reach still holds a pipe: stop reading
                pumps.cancel()
            await proc.wait()
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode  # type: ignore[operator]
        note = None
        if killed is None and Cgroups.oom_killed(cgroups):  # the kernel killed one of its processes
            oom = f"memory limit: the sandbox's processes reached {cfg.memory_bytes >> 20} MiB together (cgroup)"
            if code == 128 + signal.SIGKILL:  # the command itself was killed
                killed = oom
            else:  # another of its processes was; the command lived on and chose its exit code itself
                note = oom + ", the kernel killed one of its processes"
        if killed is None and code > 128 and code - 128 in _SIGNAL_REASONS:
            killed = _SIGNAL_REASONS[signal.Signals(code - 128)]
        return CommandResult(
            returncode=code,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.perf_counter() - start,
            killed=killed,
            truncated=out.total > out.kept or err.total > err.kept,
            note=note,
            peak_memory_bytes=watchdog.peak_memory if watchdog.memory_bytes is not None else None,
            peak_disk_bytes=watchdog.peak_disk if watchdog.disk_bytes is not None else None,
        )

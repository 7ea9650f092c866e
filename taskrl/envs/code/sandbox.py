"""The sandbox every agent command runs in: bubblewrap namespaces, rlimits, a wall timeout, output caps.

``Sandbox(SandboxConfig()).run("pytest -q", workspace)`` runs a command with no network, a read-only
system (``/usr``, the Python prefixes, a few ``/etc`` files), only the workspace (mounted at ``/workspace``)
and a small ``/tmp`` writable, rlimits on CPU seconds, address space and file size, a process cap (a pids
cgroup where this process may create one, else ``RLIMIT_NPROC``), a wall timeout that kills the whole
process tree, and stdout/stderr capped with a visible marker. Missing bubblewrap is a ``SandboxUnavailableError``;
``unsafe_no_sandbox=True`` runs commands without isolation, and only when asked for explicitly.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import itertools
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_WORKDIR = "/workspace"
SANDBOX_UID = 1000
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SIGNAL_REASONS = {
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
    signal.SIGKILL: "killed by SIGKILL (from outside the sandbox, or the kernel's OOM killer)",
    signal.SIGSEGV: "segmentation fault (possibly the memory limit)",
}


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is missing or cannot create namespaces on this machine."""


@dataclass
class SandboxConfig:
    """Limits and isolation of sandboxed commands."""

    timeout_s: float = 60.0
    """Wall-clock limit of one command; past it the whole process tree is killed."""
    cpu_seconds: int = 60
    """RLIMIT_CPU of every process in the sandbox (SIGXCPU past it)."""
    memory_bytes: int = 4 << 30
    """RLIMIT_AS (virtual address space) of every process in the sandbox."""
    max_processes: int = 128
    """Processes and threads alive at once in one command (a fork bomb stops here)."""
    max_file_bytes: int = 256 << 20
    """RLIMIT_FSIZE: the largest file a command may write (SIGXFSZ past it)."""
    tmp_bytes: int = 256 << 20
    """Size of the sandbox's private /tmp (a tmpfs, counted against memory)."""
    max_output_bytes: int = 16_000
    """Bytes of stdout and of stderr kept per command; the rest is dropped behind a visible marker."""
    kill_output_bytes: int = 8 << 20
    """A command that writes more than this (stdout + stderr) is killed: nobody reads a gigabyte of logs."""
    unsafe_no_sandbox: bool = False
    """Run commands without bubblewrap (no namespaces; rlimits, timeout and output caps still apply)."""
    bwrap: str = "bwrap"
    """The bubblewrap executable (a name on PATH or a path)."""
    ro_binds: tuple[str, ...] = ()
    """Extra host paths bound read-only at the same place (datasets, toolchains)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for sandboxed commands."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_seconds", "memory_bytes", "max_processes", "max_file_bytes", "tmp_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)}")
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
    """What a sandboxed command did. ``killed`` says why it was stopped, if it was."""

    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    killed: str | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.killed is None

    def format(self) -> str:
        """The result as the model sees it: exit status, then the (capped) output of each stream."""
        head = f"exit code {self.returncode}" + (f" ({self.killed})" if self.killed else "")
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


class _PidsCgroup:
    """Per-command pids cgroups (v1 or v2), available when this process may create them (root, delegation)."""

    _counter = itertools.count()

    def __init__(self, parent: Path) -> None:
        self.parent = parent

    @classmethod
    @functools.cache
    def find(cls) -> _PidsCgroup | None:
        """The first candidate parent where a child cgroup with ``pids.max`` can really be made."""
        for parent in _cgroup_candidates():
            probe = parent / f"taskrl-probe-{os.getpid()}"
            try:
                probe.mkdir()
            except OSError:
                continue
            usable = (probe / "pids.max").exists()
            with contextlib.suppress(OSError):
                probe.rmdir()
            if usable:
                cls._sweep(parent)
                atexit.register(cls._sweep, parent, os.getpid())
                return cls(parent)
        return None

    @staticmethod
    def _sweep(parent: Path, mine: int | None = None) -> None:
        """Remove empty cgroups left by dead processes (or, at exit, by this one: ``mine`` is its pid)."""
        for path in parent.glob("taskrl-*"):
            owner = re.match(r"^taskrl-(?:probe-)?(\d+)", path.name)
            if owner and (int(owner.group(1)) == mine or not Path(f"/proc/{owner.group(1)}").exists()):
                with contextlib.suppress(OSError):
                    path.rmdir()

    def create(self, max_processes: int) -> Path:
        path = self.parent / f"taskrl-{os.getpid()}-{next(self._counter)}"
        path.mkdir()
        (path / "pids.max").write_text(str(max_processes))
        return path

    @staticmethod
    def kill_all(path: Path) -> None:
        """SIGKILL whatever is in the cgroup now (processes that left the process group included). One pass:
        a fork racing it is caught by the next pass (the timeout path and the cgroup remover call it again)."""
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    @staticmethod
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
                        _PidsCgroup.kill_all(path)
                        still.append((path, since))
            pending = still


_REAPER = _CgroupReaper()


def _cgroup_candidates() -> list[Path]:
    """Our own pids cgroup directory in every mounted hierarchy that has the pids controller."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            own["v2" if controllers == "" else controllers] = path
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            fstype, mount, options = fields[sep + 1], fields[4], fields[-1].split(",")
            if fstype == "cgroup" and "pids" in options:
                key = next((k for k in own if "pids" in k.split(",")), None)
                if key is not None:
                    out.append(Path(mount + own[key]))
            elif fstype == "cgroup2" and "v2" in own:
                out.append(Path(mount + own["v2"]))
    return out


def _user_processes() -> int:
    """Processes this user runs now: RLIMIT_NPROC counts them all, so the sandbox's cap comes on top."""
    uid, count = os.getuid(), 0
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
    probe = [path, "--unshare-all", "--unshare-user", "--die-with-parent", *_system_args(), "/bin/true"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise SandboxUnavailableError(
            f"bubblewrap cannot create a sandbox here ({done.stderr.strip() or f'exit {done.returncode}'}); "
            "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or pass "
            "unsafe_no_sandbox=True to run without isolation"
        )
    _BWRAP_CHECKED[bwrap] = path
    return path


def _system_args() -> list[str]:
    args: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _python_prefixes() -> list[str]:
    """Where this interpreter and its packages live, so the sandbox can run the same python and pytest."""
    paths = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
    }
    covered = [p for p in _SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p)]
    return sorted(p for p in paths if not any(p == c or p.startswith(c + "/") for c in covered))


def _identity_dir() -> Path:
    """/etc/passwd and /etc/group for the sandbox user, so tools that look the user up work."""
    path = Path(tempfile.gettempdir()) / f"taskrl-sandbox-etc-{os.getuid()}"
    if not (path / "group").exists():
        path.mkdir(exist_ok=True)
        for name, text in (
            ("passwd", f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:/tmp:/bin/sh\n"),
            ("group", f"agent:x:{SANDBOX_UID}:\n"),
        ):
            tmp = path / f".{name}.{os.getpid()}"
            tmp.write_text(text)
            os.replace(tmp, path / name)
    return path


class Sandbox:
    """Runs commands in a workspace under the configured isolation. Safe to share between episodes."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.bwrap = None if self.config.unsafe_no_sandbox else _check_bwrap(self.config.bwrap)
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxUnavailableError("prlimit (util-linux) is not installed; it applies the sandbox's rlimits")
        self.prlimit = prlimit
        self._cgroups = _PidsCgroup.find()
        self.process_limit = "pids cgroup" if self._cgroups else "RLIMIT_NPROC"
        self._static_args = self._build_static_args() if self.bwrap else []
        venv_bin = os.path.dirname(sys.executable)
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
        ]  # fmt: skip
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
        for path in [*_python_prefixes(), *cfg.ro_binds]:
            args += ["--ro-bind", path, path]
        return args

    def _argv(self, command: Sequence[str], workspace: str, binds: Sequence[Bind]) -> list[str]:
        if not self.isolated:
            return list(command)
        argv = [self.bwrap, *self._static_args, "--bind", workspace, SANDBOX_WORKDIR]  # type: ignore[list-item]
        for b in binds:
            argv += ["--bind" if b.writable else "--ro-bind", b.host, b.target]
        # last: every mount point exists by now, and the sandbox's own root becomes read-only too
        return [*argv, "--remount-ro", "/", "--chdir", SANDBOX_WORKDIR, "--", *command]

    def _launcher(self, cgroup: Path | None, nproc: int | None) -> list[str]:
        """Exec wrappers that apply the limits before anything else runs. Not a preexec_fn: without one Python
        spawns with vfork, which stays fast in a large process (fork() of a process holding a model is slow)."""
        cfg = self.config
        limits = [
            self.prlimit,
            f"--cpu={cfg.cpu_seconds}:{cfg.cpu_seconds + 1}",
            f"--as={cfg.memory_bytes}",
            f"--fsize={cfg.max_file_bytes}",
            "--core=0",
            *([f"--nproc={nproc}"] if nproc is not None else []),
            "--",
        ]
        if cgroup is None:
            return limits
        # the shell moves itself into the pids cgroup and only then execs, so no process starts outside it
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *limits]

    async def run(
        self,
        command: Sequence[str] | str,
        workspace: str | os.PathLike[str],
        *,
        binds: Sequence[Bind] = (),
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``command`` (argv, or a string for ``/bin/sh -c``) in ``workspace``. Never raises for what the
        command does: limits hit, timeouts and output floods are reported in the result."""
        cfg = self.config
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("empty command")
        timeout = cfg.timeout_s if timeout_s is None else timeout_s
        cgroup = self._cgroups.create(cfg.max_processes) if self._cgroups else None
        nproc = None if cgroup else cfg.max_processes + _user_processes()
        start = time.perf_counter()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._launcher(cgroup, nproc),
                *self._argv(argv, str(workspace), binds),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=str(workspace),
                env={**self._env, **(env or {})},
                start_new_session=True,  # its own process group: one killpg stops the tree
            )
            return await self._supervise(proc, cgroup, timeout, start)
        finally:
            if cgroup is not None:
                _PidsCgroup.remove(cgroup)

    async def _supervise(
        self, proc: asyncio.subprocess.Process, cgroup: Path | None, timeout: float, start: float
    ) -> CommandResult:
        cfg = self.config
        out, err = _Capture(cfg.max_output_bytes), _Capture(cfg.max_output_bytes)
        killed: str | None = None

        def kill(reason: str) -> None:
            nonlocal killed
            killed = killed or reason
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if cgroup is not None:
                _PidsCgroup.kill_all(cgroup)

        async def pump(stream: asyncio.StreamReader, capture: _Capture) -> None:
            while data := await stream.read(65536):
                capture.add(data)
                if out.total + err.total > cfg.kill_output_bytes and killed is None:
                    kill(f"output limit: more than {cfg.kill_output_bytes} bytes written, command killed")

        pumps = asyncio.ensure_future(asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err)))  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            kill(f"wall timeout: killed after {timeout:g}s")
        except BaseException:  # cancelled (e.g. the tool's own timeout): never leave the tree running
            kill("cancelled")
            raise
        finally:
            # Whatever the command left behind would hold the pipes open: end it too. In the sandbox the pid
            # namespace already ended it with the command; without one, only the group and cgroup reach it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if cgroup is not None and (killed is not None or not self.isolated):
                _PidsCgroup.kill_all(cgroup)
            try:
                await asyncio.wait_for(asyncio.shield(pumps), 5.0)
            except TimeoutError:  # a process outside our reach still holds a pipe: stop reading
                pumps.cancel()
            await proc.wait()
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode  # type: ignore[operator]
        if killed is None and code > 128 and code - 128 in _SIGNAL_REASONS:
            killed = _SIGNAL_REASONS[signal.Signals(code - 128)]
        return CommandResult(
            returncode=code,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.perf_counter() - start,
            killed=killed,
            truncated=out.total > out.kept or err.total > err.kept,
        )

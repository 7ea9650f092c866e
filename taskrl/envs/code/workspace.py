"""Copy-on-write workspaces cloned from a base tree, with snapshots, a warm pool and cleanup on every exit path.

``pool_for(base).acquire()`` hands out a ``Workspace`` whose ``path`` looks like a private copy of ``base``.
Two clone strategies: ``overlay`` (an overlayfs mount over the untouched base: true copy-on-write for every
writer, about 1 ms per workspace; needs root) and ``hardlink`` (every file a hard link into a read-only frozen
copy of the base; ``write_file`` breaks the link first, so the base is never changed; commands in the
sandbox can replace files but not write into a file that is still shared). ``snapshot(name)``/``restore(name)``
checkpoint a workspace mid-episode at the cost of the files it changed. Workspaces are removed by
``destroy()``, by ``atexit``, and, after a crash, by the next process's sweep of its workspace root.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import itertools
import os
import re
import shutil
import stat
import tempfile
import threading
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

WorkspaceMode = Literal["auto", "overlay", "hardlink"]
_MNT_DETACH = 2
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class WorkspaceError(RuntimeError):
    """A workspace could not be created, checkpointed or restored."""


class PathOutsideWorkspaceError(ValueError):
    """A path given by the agent points outside its workspace (absolute, '..', or a symlink out)."""


@dataclass
class WorkspaceConfig:
    """Where workspaces live and how they are cloned."""

    root: str | None = None
    """Directory holding the workspaces; None = ``$TMPDIR/taskrl-workspaces``."""
    mode: WorkspaceMode = "auto"
    """``overlay`` (root only), ``hardlink``, or ``auto`` (overlay when it works here, else hardlink)."""
    pool_size: int = 2
    """Clean workspaces kept ready per base tree (the warm pool); 0 creates each one on demand."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "overlay", "hardlink"):
            raise ValueError(f"WorkspaceConfig.mode must be auto, overlay or hardlink, got {self.mode!r}")
        if self.pool_size < 0:
            raise ValueError(f"WorkspaceConfig.pool_size must be >= 0, got {self.pool_size}")
        if self.root is not None and any(c in self.root for c in ",:\\"):
            raise ValueError(f"WorkspaceConfig.root must not contain ',', ':' or '\\' (overlay options): {self.root}")

    def root_dir(self) -> Path:
        return Path(self.root) if self.root else Path(tempfile.gettempdir()) / "taskrl-workspaces"


# -- overlay mounts ------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount overlay on {target}: {os.strerror(err)}")


def _unmount(target: Path) -> None:
    if _libc.umount2(str(target).encode(), _MNT_DETACH) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


_OVERLAY_WORKS: dict[Path, bool] = {}


def overlay_available(root: Path) -> bool:
    """Whether an overlay can be mounted under ``root`` (root privileges, kernel support); probed once."""
    if root not in _OVERLAY_WORKS:
        probe = root / f".probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        try:
            for name in ("lower", "upper", "work", "view"):
                (probe / name).mkdir(parents=True)
            _mount_overlay(probe / "lower", probe / "upper", probe / "work", probe / "view")
            _unmount(probe / "view")
            _OVERLAY_WORKS[root] = True
        except OSError:
            _OVERLAY_WORKS[root] = False
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    return _OVERLAY_WORKS[root]


# -- tree copies that keep overlay metadata and hard links to a frozen base --------------------------------


def _copy_entry(src: Path, dst: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISCHR(st.st_mode):  # an overlay whiteout (a deleted file): char device 0/0
        os.mknod(dst, stat.S_IFCHR | stat.S_IMODE(st.st_mode), st.st_rdev)
    else:
        shutil.copyfile(src, dst, follow_symlinks=False)
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    _copy_xattrs(src, dst)


def _copy_xattrs(src: Path, dst: Path) -> None:
    """Overlay keeps opaque-directory and redirect marks in trusted.overlay.* attributes."""
    with contextlib.suppress(OSError):
        for name in os.listxattr(src, follow_symlinks=False):
            if name.startswith("trusted.overlay."):
                os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """rm -rf that also gets through directories a command made read-only."""

    def unlock_and_retry(function, failed_path, _exc_info) -> None:  # type: ignore[no-untyped-def]
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed_path), 0o700)
            if os.path.isdir(failed_path) and not os.path.islink(failed_path):
                os.chmod(failed_path, 0o700)
            function(failed_path)

    shutil.rmtree(path, onerror=unlock_and_retry)  # noqa: B026 - onerror is the 3.11 spelling
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)


def copy_tree(src: Path, dst: Path, *, link_inodes: frozenset[tuple[int, int]] = frozenset()) -> None:
    """Copy ``src`` to ``dst`` (which must not exist) without following symlinks; files whose inode is in
    ``link_inodes`` are hard-linked instead of copied (they are read-only and shared by design)."""
    os.mkdir(dst)
    _copy_xattrs(src, dst)
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target_dir = dst if rel == "." else dst / rel
        for name in dirnames:
            source = Path(dirpath, name)
            st = source.lstat()
            if stat.S_ISLNK(st.st_mode):  # os.walk lists symlinks to directories here; copy the link
                _copy_entry(source, target_dir / name, st)
            else:
                os.mkdir(target_dir / name, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
                _copy_xattrs(source, target_dir / name)
        for name in filenames:
            source = Path(dirpath, name)
            st = source.lstat()
            if (st.st_dev, st.st_ino) in link_inodes:
                os.link(source, target_dir / name)
            else:
                _copy_entry(source, target_dir / name, st)


# -- the base tree -------------------------------------------------------------------------------------------


class BaseTree:
    """A directory workspaces are cloned from; never written to. Hardlink mode uses a read-only frozen copy."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).resolve()
        if not self.path.is_dir():
            raise WorkspaceError(f"base tree {self.path} is not a directory")
        self._frozen: tuple[Path, list[str], list[str], frozenset[tuple[int, int]]] | None = None
        self._lock = threading.Lock()

    def frozen(self, root: Path) -> tuple[Path, list[str], list[str], frozenset[tuple[int, int]]]:
        """(frozen copy, its directories, its files, its inodes), made once: files read-only so that a command
        cannot write through a shared hard link into every other workspace."""
        with self._lock:
            if self._frozen is None:
                frozen = root / f"base-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                copy_tree(self.path, frozen)
                dirs, files, inodes = [], [], set()
                for dirpath, dirnames, filenames in os.walk(frozen):
                    rel = os.path.relpath(dirpath, frozen)
                    dirs += [os.path.normpath(os.path.join(rel, d)) for d in dirnames]
                    for name in filenames:
                        full = os.path.join(dirpath, name)
                        st = os.lstat(full)
                        if stat.S_ISREG(st.st_mode):
                            os.chmod(full, stat.S_IMODE(st.st_mode) & ~0o222)
                            inodes.add((st.st_dev, st.st_ino))
                        files.append(os.path.normpath(os.path.join(rel, name)))
                self._frozen = (frozen, dirs, files, frozenset(inodes))
                _TO_REMOVE.append(frozen)
            return self._frozen


# -- workspaces ----------------------------------------------------------------------------------------------

_LIVE: dict[int, Workspace] = {}
_TO_REMOVE: list[Path] = []
_counter = itertools.count()


class Workspace:
    """One agent's working tree. ``path`` is what tools read and write and what the sandbox mounts."""

    def __init__(self, base: BaseTree, root: Path, mode: Literal["overlay", "hardlink"]) -> None:
        self.base, self.mode = base, mode
        root = root.resolve()
        self.dir = root / f"{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        self.path = self.dir / "view"
        self._snapshots: dict[str, Path] = {}
        self._layer = 0
        self.dir.mkdir(parents=True)
        _LIVE[id(self)] = self
        try:
            if mode == "overlay":
                self.path.mkdir()
                self._mount(self._new_upper())
            else:
                frozen, dirs, files, _ = base.frozen(root)
                self.path.mkdir()
                source, target = f"{frozen}/", f"{self.path}/"  # str joins: this loop is the clone's cost
                for d in dirs:
                    os.mkdir(target + d)
                for f in files:
                    os.link(source + f, target + f, follow_symlinks=False)
        except BaseException:
            self.destroy()
            raise

    # overlay internals: each (re)mount gets fresh upper/work directories, so a lazily detached old mount
    # can never see or share them
    def _new_upper(self) -> Path:
        self._layer += 1
        upper = self.dir / f"upper{self._layer}"
        upper.mkdir()
        return upper

    def _mount(self, upper: Path) -> None:
        work = self.dir / f"work{self._layer}"
        work.mkdir()
        _mount_overlay(self.base.path, upper, work, self.path)
        self._upper = upper

    def _discard(self, path: Path) -> None:
        """Move a tree out of the way in O(1); deleting it would put the deletion on the restore's latency.
        Discarded trees go with the workspace at ``destroy``."""
        trash = self.dir / "trash"
        trash.mkdir(exist_ok=True)
        os.rename(path, trash / uuid.uuid4().hex)

    @property
    def alive(self) -> bool:
        return id(self) in _LIVE

    def resolve(self, relpath: str, *, must_exist: bool = False) -> Path:
        """The host path of a workspace-relative path; refuses absolute paths, '..' and symlinks that lead out."""
        if not isinstance(relpath, str) or "\x00" in relpath:
            raise PathOutsideWorkspaceError("path must be a string without NUL bytes")
        if os.path.isabs(relpath):
            raise PathOutsideWorkspaceError(f"'{relpath}' is absolute: give a path relative to the workspace root")
        if ".." in Path(relpath).parts:
            raise PathOutsideWorkspaceError(f"'{relpath}' uses '..': paths must stay inside the workspace")
        candidate = self.path / relpath
        real = Path(os.path.realpath(candidate))
        if real != self.path and self.path not in real.parents:
            raise PathOutsideWorkspaceError(
                f"'{relpath}' is a symlink (or under one) that points outside the workspace"
            )
        if must_exist and not os.path.lexists(candidate):
            raise FileNotFoundError(f"'{relpath}' does not exist in the workspace")
        return real

    def write_file(self, relpath: str, data: bytes) -> Path:
        """Write a file without ever writing into a shared inode: a new file replaces the old one atomically."""
        target = self.resolve(relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o644
        with contextlib.suppress(FileNotFoundError):
            mode = stat.S_IMODE(target.stat().st_mode) | 0o200
        tmp = target.parent / f".{target.name}.taskrl-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return target

    def snapshot(self, name: str) -> None:
        """Checkpoint the workspace as it is now (costs the files changed since the base)."""
        if not _NAME_RE.match(name):
            raise WorkspaceError(f"snapshot name {name!r} must be 1-64 characters of letters, digits, '_.-'")
        target = self.dir / "snapshots" / name
        if target.exists():
            self._discard(target)
        target.parent.mkdir(exist_ok=True)
        if self.mode == "overlay":
            copy_tree(self._upper, target)
        else:
            copy_tree(self.path, target, link_inodes=self.base.frozen(self.dir.parent)[3])
        self._snapshots[name] = target

    def restore(self, name: str) -> None:
        """Put the workspace back exactly as it was at ``snapshot(name)``; the snapshot stays usable."""
        if name not in self._snapshots:
            known = ", ".join(sorted(self._snapshots)) or "none"
            raise WorkspaceError(f"no snapshot named {name!r} (snapshots: {known})")
        source = self._snapshots[name]
        if self.mode == "overlay":
            _unmount(self.path)
            self._discard(self._upper)
            self._discard(self.dir / f"work{self._layer}")
            upper = self.dir / f"upper{self._layer + 1}"
            copy_tree(source, upper)
            self._layer += 1
            self._mount(upper)
        else:
            self._discard(self.path)
            copy_tree(source, self.path, link_inodes=self.base.frozen(self.dir.parent)[3])

    @property
    def snapshots(self) -> list[str]:
        return sorted(self._snapshots)

    def destroy(self) -> None:
        """Unmount and delete everything of this workspace. Idempotent."""
        _LIVE.pop(id(self), None)
        if self.mode == "overlay":
            with contextlib.suppress(OSError):
                _unmount(self.path)
        with contextlib.suppress(FileNotFoundError):
            remove_tree(self.dir)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _resolve_mode(config: WorkspaceConfig, root: Path, base: Path) -> Literal["overlay", "hardlink"]:
    if config.mode == "hardlink":
        return "hardlink"
    unmountable = any(c in str(base) for c in ",:\\")  # overlay's option syntax cannot quote these
    if overlay_available(root) and not unmountable:
        return "overlay"
    if config.mode == "overlay":
        why = f"its path {base} contains ',', ':' or '\\'" if unmountable else f"mounting under {root} failed"
        raise WorkspaceError(f"overlay workspaces need root and overlayfs ({why}); use mode='hardlink' or 'auto'")
    return "hardlink"


class WorkspacePool:
    """Clean workspaces of one base tree, kept ready by a background thread (the warm pool)."""

    def __init__(self, base: BaseTree, config: WorkspaceConfig) -> None:
        self.base, self.config = base, config
        config.root_dir().mkdir(parents=True, exist_ok=True)
        self.root = config.root_dir().resolve()
        sweep_stale(self.root)
        self.mode = _resolve_mode(config, self.root, base.path)
        self._ready: deque[Workspace] = deque()
        self._lock = threading.Lock()
        self._filler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taskrl-workspace-pool")
        self._pending: Future[None] | None = None
        self._closed = False
        self._refill()

    def create(self) -> Workspace:
        """A new workspace, bypassing the pool."""
        return Workspace(self.base, self.root, self.mode)

    def acquire(self) -> Workspace:
        """A clean workspace: a warm one when ready, else one made now. The caller destroys it when done."""
        if self._closed:
            raise WorkspaceError("workspace pool is closed")
        with self._lock:
            ws = self._ready.popleft() if self._ready else None
        self._refill()
        return ws if ws is not None else self.create()

    def _refill(self) -> None:
        with self._lock:
            if (
                self._closed
                or len(self._ready) >= self.config.pool_size
                or (self._pending and not self._pending.done())
            ):
                return
            self._pending = self._filler.submit(self._fill)

    def _fill(self) -> None:
        while not self._closed:
            with self._lock:
                if len(self._ready) >= self.config.pool_size:
                    return
            ws = self.create()
            with self._lock:
                if self._closed:
                    ws.destroy()
                    return
                self._ready.append(ws)

    def close(self) -> None:
        """Stop refilling and destroy the warm workspaces (handed-out ones belong to their users)."""
        self._closed = True
        self._filler.shutdown(wait=True)
        with self._lock:
            while self._ready:
                self._ready.popleft().destroy()


_POOLS: dict[tuple[Path, Path, str, int], WorkspacePool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(base: str | os.PathLike[str], config: WorkspaceConfig | None = None) -> WorkspacePool:
    """The process-wide pool of one base tree (envs are made per episode; their workspaces come from here)."""
    config = config or WorkspaceConfig()
    key = (Path(base).resolve(), config.root_dir().resolve(), config.mode, config.pool_size)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = WorkspacePool(BaseTree(base), config)
        return _POOLS[key]


def sweep_stale(root: Path) -> int:
    """Remove workspaces and frozen bases left by processes that died without cleaning up; returns how many."""
    removed = 0
    mounts = _mounts_under(root)
    for entry in os.scandir(root):
        match = re.match(r"^(?:base-|\.probe-)?(\d+)-", entry.name)
        if not match or _pid_alive(int(match.group(1))):
            continue
        for mount in sorted((m for m in mounts if m.startswith(entry.path + "/")), reverse=True):
            with contextlib.suppress(OSError):
                _unmount(Path(mount))
        remove_tree(entry.path)
        removed += 1
    return removed


def _mounts_under(root: Path) -> list[str]:
    with contextlib.suppress(OSError):
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        return [line.split()[4] for line in lines if line.split()[4].startswith(str(root.resolve()) + "/")]
    return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@atexit.register
def _cleanup_at_exit() -> None:
    for pool in list(_POOLS.values()):
        with contextlib.suppress(Exception):
            pool.close()
    for ws in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            ws.destroy()
    for path in _TO_REMOVE:
        with contextlib.suppress(FileNotFoundError):
            remove_tree(path)

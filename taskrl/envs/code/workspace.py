"""Copy-on-write workspaces cloned from a base tree, with snapshots, a warm pool and cleanup on every exit path.

``pool_for(base).acquire()`` hands out a ``Workspace`` whose ``path`` looks like a private copy of ``base``.
Three clone strategies: ``overlay`` (an overlayfs mount over a private copy of the base: true copy-on-write for
every writer, about 1 ms per workspace; needs root), ``hardlink`` (root only: every file a hard link into a
frozen copy of the base owned by root and read-only to the sandbox's unprivileged uid, which can therefore
neither write nor chmod a shared inode; ``write_file`` replaces the link, and commands can replace files but
get EACCES writing into one still shared) and ``copy`` (a full copy: what non-root users get, since there
the sandbox uid owns every inode it could share). ``snapshot(name)``/``restore(name)``
checkpoint a workspace mid-episode at the cost of the files it changed. Workspaces are removed by
``destroy()``, by ``atexit``, and, after a crash, by the next process's sweep of its workspace root.
Mounts are in ``mounts``, the host-side tree walks, copies and removal in ``trees``.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import stat
import tempfile
import threading
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from taskrl.envs.code.limits import DISK_MECHANISM
from taskrl.envs.code.mounts import _mount_overlay, _mount_tmpfs, _mounts_under, _unmount, overlay_available
from taskrl.envs.code.trees import (
    _ROOT,
    MAX_TREE_DEPTH,
    PathOutsideWorkspaceError,
    TreeTooDeepError,
    WorkspaceError,
    copy_tree,
    remove_tree,
    tree_bytes,
    walk_tree,
)

__all__ = [
    "MAX_TREE_DEPTH", "BaseTree", "PathOutsideWorkspaceError", "TreeTooDeepError", "Workspace", "WorkspaceConfig",
    "WorkspaceError", "WorkspaceMode", "WorkspacePool", "agent_uid", "copy_tree", "overlay_available", "pool_for",
    "private_root", "remove_tree", "sweep_stale", "walk_tree",
]  # fmt: skip

WorkspaceMode = Literal["auto", "overlay", "hardlink", "copy"]
CloneMode = Literal["overlay", "hardlink", "copy"]
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass
class WorkspaceConfig:
    """Where workspaces live and how they are cloned."""

    root: str | None = None
    """Directory holding the workspaces; None = ``$TMPDIR/taskrl-workspaces``."""
    mode: WorkspaceMode = "auto"
    """``overlay`` (root only), ``hardlink`` (root only), ``copy``, or ``auto`` (overlay when it works here,
    else hardlink as root, else copy)."""
    pool_size: int = 2
    """Clean workspaces kept ready per base tree (the warm pool); 0 creates each one on demand."""
    disk_quota_bytes: int = 1 << 30
    """What the agent may add to a workspace: a size-limited tmpfs under the overlay's upper layer (writes
    past it fail with ENOSPC), else enforced per command by the sandbox's watchdog."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "overlay", "hardlink", "copy"):
            raise ValueError(f"WorkspaceConfig.mode must be auto, overlay, hardlink or copy, got {self.mode!r}")
        if self.disk_quota_bytes <= 0:
            raise ValueError(f"WorkspaceConfig.disk_quota_bytes must be > 0, got {self.disk_quota_bytes}")
        if self.pool_size < 0:
            raise ValueError(f"WorkspaceConfig.pool_size must be >= 0, got {self.pool_size}")
        if self.root is not None and any(c in self.root for c in ",:\\"):
            raise ValueError(f"WorkspaceConfig.root must not contain ',', ':' or '\\' (overlay options): {self.root}")

    def root_dir(self) -> Path:
        return Path(self.root) if self.root else Path(tempfile.gettempdir()) / "taskrl-workspaces"


# -- the base tree -------------------------------------------------------------------------------------------


class BaseTree:
    """A directory workspaces are cloned from; never written to. Hardlink mode uses a read-only frozen copy."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).resolve()
        if not self.path.is_dir():
            raise WorkspaceError(f"base tree {self.path} is not a directory")
        self._frozen: tuple[Path, list[str], list[str], frozenset[tuple[int, int]]] | None = None
        self._lower: Path | None = None
        self._lock = threading.Lock()

    def lower(self, root: Path) -> Path:
        """The overlay's lower layer, made once: a private copy owned by the sandbox uid (as root), so that
        the agent may change every file (overlay copies it up) while the base itself is never mounted."""
        with self._lock:
            if self._lower is None:
                lower = root / f"base-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                copy_tree(self.path, lower, owner=agent_uid())
                self._lower = lower
                _TO_REMOVE.append(lower)
            return self._lower

    def frozen(self, root: Path) -> tuple[Path, list[str], list[str], frozenset[tuple[int, int]]]:
        """(frozen copy, its directories, its files, its inodes), made once: files read-only so that a command
        cannot write through a shared hard link into every other workspace."""
        with self._lock:
            if self._frozen is None:
                frozen = root / f"base-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                copy_tree(self.path, frozen, owner=0 if _ROOT else None)  # root's: the sandbox uid cannot chmod
                dirs, files, inodes = [], [], set()
                for rel, st in walk_tree(frozen):
                    if stat.S_ISDIR(st.st_mode):
                        dirs.append(rel)
                        continue
                    if stat.S_ISREG(st.st_mode):
                        os.chmod(frozen / rel, stat.S_IMODE(st.st_mode) & ~0o222)
                        inodes.add((st.st_dev, st.st_ino))
                    files.append(rel)
                self._frozen = (frozen, dirs, files, frozenset(inodes))
                _TO_REMOVE.append(frozen)
            return self._frozen


# -- workspaces ----------------------------------------------------------------------------------------------

_LIVE: dict[int, Workspace] = {}
_TO_REMOVE: list[Path] = []
_counter = itertools.count()


class Workspace:
    """One agent's working tree. ``path`` is what tools read and write and what the sandbox mounts."""

    def __init__(self, base: BaseTree, root: Path, mode: CloneMode, disk_quota_bytes: int = 1 << 30) -> None:
        self.base, self.mode = base, mode
        self.disk_quota_bytes = disk_quota_bytes
        self._usage: int | None = None
        """The quota's reading of the tree (``disk_usage``), kept exact across this object's own writes; None:
        not measured yet, or changed in a way only a walk can tell."""
        self._unmeasurable = False
        self.owner = agent_uid()
        """Host uid owning the workspace's files (the sandbox's, as root); None: this process's own."""
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
                self._layers = self.dir / "layers"
                self._layers.mkdir()
                _mount_tmpfs(self._layers, disk_quota_bytes)
                self._mount(self._new_upper())
            elif mode == "copy":
                copy_tree(base.path, self.path, owner=self.owner)
            else:
                frozen, dirs, files, _ = base.frozen(root)
                self.path.mkdir()
                source, target = f"{frozen}/", f"{self.path}/"  # str joins: this loop is the clone's cost
                owner = self.owner
                for d in dirs:
                    os.mkdir(target + d)
                    if owner is not None:  # the agent may add and replace files, never write shared ones
                        os.chown(target + d, owner, owner)
                if owner is not None:
                    os.chown(self.path, owner, owner)
                for f in files:
                    os.link(source + f, target + f, follow_symlinks=False)
        except BaseException:
            self.destroy()
            raise

    # overlay internals: each (re)mount gets fresh upper/work directories, so a lazily detached old mount
    # can never see or share them
    def _new_upper(self) -> Path:
        self._layer += 1
        upper = self._layers / f"upper{self._layer}"
        upper.mkdir()
        return upper

    def _mount(self, upper: Path) -> None:
        work = self._layers / f"work{self._layer}"
        work.mkdir()
        lower = self.base.lower(self.dir.parent)
        if self.owner is not None:  # the merged root directory is the upper's: the agent's, like the rest
            os.chown(upper, self.owner, self.owner)
            os.chmod(upper, stat.S_IMODE(os.stat(lower).st_mode) | 0o700)
        _mount_overlay(lower, upper, work, self.path)
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
        self._make_parents(target.parent)
        mode = 0o644
        with contextlib.suppress(FileNotFoundError):
            mode = stat.S_IMODE(target.stat().st_mode) | 0o200
        tmp = target.parent / f".{target.name}.taskrl-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
            os.chmod(tmp, mode)
            if self.owner is not None:
                os.chown(tmp, self.owner, self.owner)
            change = self._usage_change(target, os.lstat(tmp))
            os.replace(tmp, target)
            if self._usage is not None:
                self._usage = None if change is None else self._usage + change
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return target

    def _shared_inodes(self) -> frozenset[tuple[int, int]]:
        """The base's inodes hard-linked into a hardlink workspace: they cost it nothing."""
        return self.base.frozen(self.dir.parent)[3] if self.mode == "hardlink" else frozenset()

    def _usage_change(self, target: Path, new: os.stat_result) -> int | None:
        """What replacing ``target`` with the file ``new`` changes in ``disk_usage``, by ``tree_bytes``'s rule
        (regular files' blocks, each inode once, shared base inodes free); None where only a walk can tell (the
        old file has another link that may or may not be inside the tree)."""
        if self.mode == "overlay" or self._unmeasurable:
            return 0
        try:
            old = os.lstat(target)
        except FileNotFoundError:
            return new.st_blocks * 512
        if not stat.S_ISREG(old.st_mode) or (old.st_dev, old.st_ino) in self._shared_inodes():
            return new.st_blocks * 512
        return new.st_blocks * 512 - old.st_blocks * 512 if old.st_nlink == 1 else None

    def disk_usage(self) -> int:
        """Bytes the agent added (overlay: its tmpfs layer; else the whole tree, walked: see ``disk_budget``)."""
        if self.mode == "overlay":
            st = os.statvfs(self._layers)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        # Each inode once, and only the base's own inodes (hard-linked into every workspace) are free: a hard
        # link the agent made to its own file is no way to hide the file from the quota.
        total = tree_bytes(self.path, exclude=self._shared_inodes())
        # A tree the walk cannot measure (a directory the host may not read, one deeper than MAX_TREE_DEPTH)
        # counts as full: reading it as empty would hand the next command the whole quota again.
        self._unmeasurable = total is None
        self._usage = self.disk_quota_bytes if total is None else total
        return self._usage

    def disk_mechanism(self) -> str:
        """What holds this workspace's disk quota for the whole episode (for the episode's info)."""
        if self.mode == "overlay":
            return f"size-capped tmpfs under the overlay's upper layer ({self.disk_quota_bytes >> 20} MiB)"
        return f"{DISK_MECHANISM} ({self.disk_quota_bytes >> 20} MiB per episode, what the agent added counted)"

    def disk_budget(self) -> int | None:
        """What the next command may still write: None when a mount enforces the quota itself (overlay). Walks
        the tree only when no reading is kept (the first command, after a restore); pass ``disk_growth()`` to the
        sandbox with it."""
        if self.mode == "overlay":
            return None
        if self._usage is None:
            self.disk_usage()
        return self.disk_quota_bytes - self._usage  # type: ignore[operator]

    def disk_growth(self) -> Callable[[], int | None] | None:
        """The sandbox watchdog's reading of what the tree gained since the reading ``disk_budget`` was taken from
        (call it right after): measured the same way, against the same start, so its check, gained > budget, is
        exactly usage > quota and the command needs no walk of its own at the start. None for overlay."""
        if self.mode == "overlay":
            return None
        if self._usage is None:
            self.disk_usage()
        if self._unmeasurable:
            return lambda: None  # the budget is already 0: the drop in free space stands
        start, path, shared = self._usage, self.path, self._shared_inodes()

        def gained() -> int | None:
            now = tree_bytes(path, exclude=shared)
            return None if now is None else now - start  # type: ignore[operator]

        return gained

    def quota_note(self) -> str | None:
        """A line for the agent when the workspace is (nearly) full, refreshed after every command."""
        used = self.disk_usage()
        if self._unmeasurable:
            return (
                f"[workspace disk quota: the workspace cannot be measured (a directory it may not read, or one "
                f"more than {MAX_TREE_DEPTH} levels deep), so it counts as full; restore permissions or remove it "
                "to write more]"
            )
        if used < 0.9 * self.disk_quota_bytes:
            return None
        return (
            f"[workspace disk quota: {used >> 20} MiB of {self.disk_quota_bytes >> 20} MiB used; "
            "delete files to write more]"
        )

    def _make_parents(self, directory: Path) -> None:
        missing = []
        while not directory.exists() and directory != self.path:
            missing.append(directory)
            directory = directory.parent
        for path in reversed(missing):
            path.mkdir()
            if self.owner is not None:
                os.chown(path, self.owner, self.owner)

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
        elif self.mode == "copy":
            copy_tree(self.path, target)
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
            remove_tree(self._upper)  # deleted, not set aside: it would count against the quota
            remove_tree(self._layers / f"work{self._layer}")
            upper = self._layers / f"upper{self._layer + 1}"
            copy_tree(source, upper)
            self._layer += 1
            self._mount(upper)
        else:
            self._discard(self.path)
            copy_tree(source, self.path, link_inodes=self._shared_inodes())
        self._usage = None

    @property
    def snapshots(self) -> list[str]:
        return sorted(self._snapshots)

    def destroy(self) -> None:
        """Unmount and delete everything of this workspace. Idempotent."""
        _LIVE.pop(id(self), None)
        if self.mode == "overlay":
            with contextlib.suppress(OSError):
                _unmount(self.path)
            with contextlib.suppress(OSError):
                _unmount(self.dir / "layers")
        with contextlib.suppress(FileNotFoundError):
            remove_tree(self.dir)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def agent_uid() -> int | None:
    """The host uid the sandbox runs as when it differs from ours (we are root), else None."""
    from taskrl.envs.code.sandbox import SANDBOX_HOST_UID

    return SANDBOX_HOST_UID if _ROOT else None


def _resolve_mode(config: WorkspaceConfig, root: Path, base: Path) -> CloneMode:
    if config.mode in ("hardlink", "copy"):
        if config.mode == "hardlink" and not _ROOT:
            raise WorkspaceError(
                "hardlink workspaces need root: as any other user the sandbox runs as this uid, owns the shared "
                "inodes and could chmod and write them into every other workspace; use mode='copy' or 'auto'"
            )
        return config.mode
    unmountable = any(c in str(base) for c in ",:\\")  # overlay's option syntax cannot quote these
    if overlay_available(root) and not unmountable:
        return "overlay"
    if config.mode == "overlay":
        why = f"its path {base} contains ',', ':' or '\\'" if unmountable else f"mounting under {root} failed"
        raise WorkspaceError(f"overlay workspaces need root and overlayfs ({why}); use mode='copy' or 'auto'")
    return "hardlink" if _ROOT else "copy"


def private_root(path: Path) -> Path:
    """Create (or check) a workspace root: ours, not writable by anyone else, searchable by the sandbox uid,
    so another local user can neither plant files in it nor swap it for a link."""
    with contextlib.suppress(FileExistsError):
        os.makedirs(path.parent, exist_ok=True)
        os.mkdir(path, 0o711)
        os.chmod(path, 0o711)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise WorkspaceError(
            f"workspace root {path} is not a directory owned by uid {os.geteuid()} and writable only by it "
            "(another user may have made it): remove it or set WorkspaceConfig.root to a private directory"
        )
    if _ROOT:
        from taskrl.envs.code.sandbox import SANDBOX_HOST_UID, reachable_by

        if not reachable_by(str(path / "x"), SANDBOX_HOST_UID):
            raise WorkspaceError(
                f"workspace root {path} is under a directory the sandbox uid {SANDBOX_HOST_UID} cannot search; "
                "set WorkspaceConfig.root under a world-searchable directory (e.g. /tmp)"
            )
    return path.resolve()


class WorkspacePool:
    """Clean workspaces of one base tree, kept ready by a background thread (the warm pool)."""

    def __init__(self, base: BaseTree, config: WorkspaceConfig) -> None:
        self.base, self.config = base, config
        self.root = private_root(config.root_dir())
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
        return Workspace(self.base, self.root, self.mode, self.config.disk_quota_bytes)

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


_POOLS: dict[tuple[Path, Path, str, int, int], WorkspacePool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(base: str | os.PathLike[str], config: WorkspaceConfig | None = None) -> WorkspacePool:
    """The process-wide pool of one base tree (envs are made per episode; their workspaces come from here)."""
    config = config or WorkspaceConfig()
    key = (Path(base).resolve(), config.root_dir().resolve(), config.mode, config.pool_size, config.disk_quota_bytes)
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

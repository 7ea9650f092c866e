"""Host-side operations on trees an agent made: walks, copies and removal that survive hostile trees.

Nothing here follows a link; walks are iterative and refuse depths past ``MAX_TREE_DEPTH``; removal works on
directory fds (any depth, any name, no path-length limit); copies leave FIFOs, sockets and devices out. These
are what snapshots, rewards, tampering checks and cleanup use on a workspace the agent's commands shaped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

_ROOT = os.geteuid() == 0


class WorkspaceError(RuntimeError):
    """A workspace could not be created, checkpointed or restored."""


class PathOutsideWorkspaceError(ValueError):
    """A path given by the agent points outside its workspace (absolute, '..', or a symlink out)."""


def _copy_entry(src: Path, dst: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISCHR(st.st_mode):  # an overlay whiteout (a deleted file): char device 0/0
        os.mknod(dst, stat.S_IFCHR | stat.S_IMODE(st.st_mode), st.st_rdev)
    else:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f_src, open(dst, "xb") as f_dst:
            shutil.copyfileobj(f_src, f_dst, 1 << 20)
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    _copy_xattrs(src, dst)


def _own(path: str | Path, st: os.stat_result, owner: int | None = None) -> None:
    """As root, give a copy the owner of its original (or ``owner``): the sandbox uid keeps its own files."""
    if _ROOT:
        uid = st.st_uid if owner is None else owner
        os.lchown(path, uid, st.st_gid if owner is None else owner)


def _copy_xattrs(src: Path, dst: Path) -> None:
    """Overlay keeps opaque-directory and redirect marks in trusted.overlay.* attributes."""
    with contextlib.suppress(OSError):
        for name in os.listxattr(src, follow_symlinks=False):
            if name.startswith("trusted.overlay."):
                os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """rm -rf of a tree an agent made: iterative over directory fds (any depth, any name, no path-length
    limit), never following a link, getting through directories a command made read-only."""
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    # a stack of (dir fd, entries still to remove); a directory is removed once its fd is closed and empty
    parent_fd = os.open(os.path.dirname(os.path.abspath(path)) or "/", os.O_RDONLY | os.O_DIRECTORY)
    stack: list[tuple[int, str, int]] = []  # (fd, name in parent, parent fd)
    try:
        stack.append((_open_dir(os.path.basename(path), parent_fd), os.path.basename(path), parent_fd))
        while stack:
            fd, name, parent = stack[-1]
            descended = False
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        with contextlib.suppress(OSError):
                            os.chmod(entry.name, 0o700, dir_fd=fd, follow_symlinks=False)
                        try:
                            stack.append((_open_dir(entry.name, fd), entry.name, fd))
                            descended = True
                            break
                        except OSError:
                            continue
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.name, dir_fd=fd)
            if descended:
                continue
            stack.pop()
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(name, dir_fd=parent)
    finally:
        for fd, _, _ in stack:
            os.close(fd)
        os.close(parent_fd)


def _open_dir(name: str, dir_fd: int) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)


MAX_TREE_DEPTH = 256
"""Deeper trees are refused by the host-side walks (snapshots, tampering checks), never followed into."""


class TreeTooDeepError(WorkspaceError):
    """An agent made a directory tree deeper than ``MAX_TREE_DEPTH``: snapshots and checks refuse it."""


def walk_tree(root: str | os.PathLike[str]) -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of everything under ``root``, iteratively, never following a link; directories
    come before their contents. Raises ``TreeTooDeepError`` past ``MAX_TREE_DEPTH`` levels."""
    out: list[tuple[str, os.stat_result]] = []
    root = os.fspath(root)
    todo: list[tuple[str, int]] = [("", 0)]
    while todo:
        rel, depth = todo.pop()
        if depth > MAX_TREE_DEPTH:
            raise TreeTooDeepError(f"the workspace has directories more than {MAX_TREE_DEPTH} levels deep: {rel[:80]}")
        with os.scandir(os.path.join(root, rel) if rel else root) as entries:
            for entry in entries:
                child = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                out.append((child, st))
                if stat.S_ISDIR(st.st_mode):
                    todo.append((child, depth + 1))
    return out


def tree_bytes(root: str | os.PathLike[str], *, exclude: frozenset[tuple[int, int]] = frozenset()) -> int | None:
    """Bytes the regular files under ``root`` hold on disk (allocated blocks, so a sparse file counts what it
    holds), each inode once: a hard link is no second copy. Inodes in ``exclude`` ((st_dev, st_ino) pairs: a
    base's files hard-linked into every workspace) cost nothing. Entries that vanish mid-walk are skipped (a command
    may be deleting them). None when the tree cannot be measured: deeper than ``MAX_TREE_DEPTH``, or a directory
    the walk may not read (``chmod 000`` must not hide what is inside from a quota)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    todo: list[tuple[str, int]] = [(os.fspath(root), 0)]
    try:
        while todo:
            path, depth = todo.pop()
            if depth > MAX_TREE_DEPTH:
                return None
            try:
                entries = list(os.scandir(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    todo.append((entry.path, depth + 1))
                elif stat.S_ISREG(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if key not in seen and key not in exclude:
                        seen.add(key)
                        total += st.st_blocks * 512
    except OSError:
        return None
    return total


def copy_tree(
    src: Path, dst: Path, *, link_inodes: frozenset[tuple[int, int]] = frozenset(), owner: int | None = None
) -> None:
    """Copy ``src`` to ``dst`` (which must not exist) without following symlinks; files whose inode is in
    ``link_inodes`` are hard-linked instead of copied (they are read-only and shared by design). As root,
    copies keep their original's owner, or all get ``owner``. FIFOs, sockets and devices other than overlay
    whiteouts are left out (nothing a project needs; opening one could block)."""
    entries = walk_tree(src)  # refuses hostile depths before anything is written
    os.mkdir(dst)
    _copy_xattrs(src, dst)
    root_st = os.lstat(src)
    os.chmod(dst, stat.S_IMODE(root_st.st_mode) | stat.S_IRWXU)
    _own(dst, root_st, owner)
    for rel, st in entries:
        source, target = Path(src, rel), Path(dst, rel)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(target, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
            _copy_xattrs(source, target)
        elif stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) in link_inodes:
            os.link(source, target)
            continue
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) or (stat.S_ISCHR(st.st_mode) and st.st_rdev == 0):
            _copy_entry(source, target, st)
        else:
            continue
        _own(target, st, owner)

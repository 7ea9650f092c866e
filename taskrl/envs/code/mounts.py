"""The mounts workspaces need (overlayfs views, size-limited tmpfs layers), through libc, as root only."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import uuid
from pathlib import Path

_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount overlay on {target}: {os.strerror(err)}")


def _mount_tmpfs(target: Path, size: int) -> None:
    options = f"size={size},mode=0755".encode()
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


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


def _mounts_under(root: Path) -> list[str]:
    with contextlib.suppress(OSError):
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        return [line.split()[4] for line in lines if line.split()[4].startswith(str(root.resolve()) + "/")]
    return []

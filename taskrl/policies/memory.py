"""Handing freed host memory back to the operating system.

A long-running server that builds and drops model copies (a production cycle adds a version, ``Router.retire``
drops one) frees hundreds of MB of tensors per version. Python and torch free them, but glibc's allocator keeps
blocks below its (dynamic, up to 32 MB) mmap threshold in the heap and in per-thread arenas, so the process's RSS
only grows. ``malloc_trim(0)`` returns those free pages. Elsewhere (macOS, musl) it does nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys

logger = logging.getLogger(__name__)

_libc: ctypes.CDLL | None | bool = None  # None: not looked up yet; False: not glibc


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                if hasattr(libc, "malloc_trim"):
                    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
                    _libc = libc
            except OSError:
                logger.debug("no libc with malloc_trim here; freed memory stays with the allocator")
    return _libc or None


def release_freed() -> bool:
    """Collect unreachable objects, then give the allocator's free pages back to the OS (glibc only).

    Returns whether memory could be handed back (True on glibc, False where there is no ``malloc_trim``)."""
    gc.collect()
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True

"""release_freed hands freed heap pages back to the OS on glibc."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest

from taskrl.policies.memory import release_freed


def _rss_kb() -> int:
    with open(f"/proc/{os.getpid()}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux-only")
def test_freed_small_blocks_go_back_to_the_os() -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    # 256 MB in 64 KB blocks (below the mmap threshold, so from the heap); every other one is freed: the holes
    # cannot merge into the heap's top, so free() keeps all 128 MB of them resident
    blocks = [libc.malloc(64 * 1024) for _ in range(4096)]
    for block in blocks:
        libc.memset(block, 1, 64 * 1024)
    for block in blocks[::2]:
        libc.free(block)
    before = _rss_kb()
    assert release_freed() is True
    after = _rss_kb()
    for block in blocks[1::2]:
        libc.free(block)
    assert before - after > 64 * 1024, (before, after)  # most of the 128 MB of holes is handed back

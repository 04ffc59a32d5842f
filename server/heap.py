"""glibc's malloc told to hand large blocks back to the system at once.

glibc serves a block of ``M_MMAP_THRESHOLD`` bytes or more (128 KiB at first) with its
own ``mmap``, which ``free`` unmaps. But each time such a block is freed it raises the
threshold to that block's size (up to 32 MiB): after the first 4 MiB PUT segment
(``holdfast.sdk.putsegments``) a proxy frees, every later segment and every 1 MiB
frame comes from the heap, whose freed holes are neither reused in full nor given
back. Measured with ``bench/proxy_memory.py`` (16 KiB PUTs, a 256 MiB bound, the
broker killed and started again): peak RSS 331 MiB as glibc leaves it; with the
threshold fixed (which turns the raising off) 317-321 MiB at 1 MiB and 318-319 MiB at
2 MiB, which maps the segments and leaves the frames (1 MiB at most) to the heap, where
blocks of one size reuse each other's holes. The proxy sets it before it serves;
elsewhere (musl, macOS) there is no ``mallopt`` and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number for the threshold (glibc's ``malloc.h``)."""

PROXY_MMAP_THRESHOLD = 1 << 21
"""Blocks from 2 MiB up (the 4 MiB PUT segments) are mapped on their own."""

log = logging.getLogger(__name__)


def fix_mmap_threshold(nbytes: int = PROXY_MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``nbytes``; False where the C library has no
    ``mallopt`` or refuses it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, nbytes) != 1:
        log.debug("mallopt(M_MMAP_THRESHOLD, %d) refused", nbytes)
        return False
    return True

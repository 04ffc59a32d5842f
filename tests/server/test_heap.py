"""``holdfast.server.heap``: with the mmap threshold fixed, a large block freed does
not send the next ones to the heap (glibc's dynamic threshold would)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util, sys
    from holdfast.server.heap import fix_mmap_threshold

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "fixed":
        assert fix_mmap_threshold()
    first = bytearray(4 << 20)  # freed: glibc would raise its threshold to 4 MiB
    del first
    before = libc.mallinfo2().hblkhd
    second = bytearray(3 << 20)
    print(libc.mallinfo2().hblkhd - before)
    """
)


def _mapped_bytes_of_a_3_mib_block(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_block_leaves_the_threshold_where_it_was_fixed() -> None:
    assert _mapped_bytes_of_a_3_mib_block("glibc") == 0  # what the proxy avoids
    assert _mapped_bytes_of_a_3_mib_block("fixed") >= 3 << 20

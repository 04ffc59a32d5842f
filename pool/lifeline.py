"""``python -m holdfast.pool.lifeline PARENT_PID COMMAND...``: run COMMAND so that it
dies with its manager.

Sets the parent-death signal (Linux ``PR_SET_PDEATHSIG``: SIGKILL when the thread
that started this process ends) and then replaces itself with COMMAND, which keeps
the setting across ``exec``. It is a separate program rather than a
``preexec_fn`` because Python code between ``fork`` and ``exec`` in a process that
runs gRPC's threads can abort the child (seen in this project's tests: a worker
killed by SIGABRT from gRPC's poller before it reached ``exec``). If the manager
died before the signal was set, COMMAND is not run at all.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1

EXIT_PARENT_GONE = 70
"""The exit status when the manager was gone before the worker could start."""


def main(argv: list[str]) -> int:
    """Set the parent-death signal, then exec the command (never returns on success)."""
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m holdfast.pool.lifeline PARENT_PID COMMAND...", file=sys.stderr)
        return 2
    parent, command = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            print(f"prctl(PR_SET_PDEATHSIG): errno {ctypes.get_errno()}", file=sys.stderr)
            return EXIT_PARENT_GONE
    if os.getppid() != parent:  # the manager died before the signal was set
        return EXIT_PARENT_GONE
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"cannot run {command[0]!r}: {error.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

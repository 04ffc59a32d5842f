"""A broker whose Redis refuses it for a reason no retry mends (credentials, a
certificate, a database) must stop at once, not retry it as an outage."""

from __future__ import annotations

import subprocess
import sys
import time


def refused_at_once(store: str, named: str, *flags: str) -> str:
    """A broker on ``--store store`` (and ``flags``) exits 2 within seconds (not after
    --redis-retry, 30 s by default) with one line holding ``named``, which it returns;
    the line never calls it an outage."""
    started = time.monotonic()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "holdfast.broker", "--listen", "127.0.0.1:0"),
            *("--store", store, *flags),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 15, done.stderr
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert named in line
    assert "reachable" not in line
    return line

"""gRPC's own log lines, in the server's log format.

gRPC's C core writes its log lines (``I1125 07:11:38.528389 4189
ssl_transport_security.cc:2563] Handshake failed ...``) straight to file descriptor
2, past Python's ``logging``: with ``--log-format json`` they broke the one-object-a-
line stream, and a TLS handshake failure was OpenSSL jargon. ``route_grpc_logs``
points descriptor 2 at a pipe, moves Python's own ``sys.stderr`` to a copy of the
real one (so the log handler still writes there), and re-logs every line from the
pipe through the ``grpc`` logger: glog's level letter becomes the record's level, and
a TLS handshake failure is named (``holdfast.proto.tls_failures``) with the raw line
after it. A client that keeps retrying a handshake that cannot succeed fails several
times a second: each kind of failure is logged once per ``HANDSHAKE_LOG_INTERVAL``,
with the count of those not logged (gRPC's line does not name the peer, so the kind is
the key). Only the command lines call it (the servers', the pool's, the admin
command's): a library must not take a process's stderr.
"""

from __future__ import annotations

import io
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable

from holdfast.proto.tls_failures import SERVER_FAILURES, name_failure

log = logging.getLogger("holdfast.grpc")

HANDSHAKE_LOG_INTERVAL = 10.0
"""Seconds between two logged TLS handshake failures of the same kind."""

_GLOG = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ (\S+:\d+)\] (.*)$")
_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}


def route_grpc_logs(server: bool = True) -> threading.Thread:
    """Capture descriptor 2 and re-log what arrives there (see the module docstring).
    Call it before the first log line and before gRPC starts; returns the reader.
    ``server=False`` (a client's command line: the pool, the admin command): a TLS
    failure is the error the call raises, which names it, so gRPC's line about it is
    kept at DEBUG rather than logged a second time, as a server's would be."""
    sys.stderr.flush()
    real_stderr = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    stream = io.TextIOWrapper(
        io.FileIO(real_stderr, "w"), encoding="utf-8", errors="backslashreplace",
        line_buffering=True,
    )  # fmt: skip
    sys.stderr = stream
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is not stream:
            handler.setStream(stream)
    reader = threading.Thread(
        target=_relay, args=(read_end, server), name="holdfast-grpc-logs", daemon=True
    )
    reader.start()
    return reader


def relog(line: str, server: bool = True) -> None:
    """Log one line gRPC (or anything else) wrote to descriptor 2 (``server``: see
    ``route_grpc_logs``)."""
    line = line.rstrip("\n")
    if not line.strip():
        return
    matched = _GLOG.match(line)
    if matched is None:
        log.warning("%s", line)
        return
    letter, source, text = matched.groups()
    named = name_failure(text, SERVER_FAILURES)
    level = _LEVELS[letter]
    if named is not None and not server:
        log.debug("%s [%s]", text, source)
    elif named is not None:
        quiet = _handshakes.admit(named)
        if quiet is None:
            return
        more = (
            f" ({quiet} more like it not logged in {HANDSHAKE_LOG_INTERVAL:g} s)" if quiet else ""
        )
        log.log(max(level, logging.WARNING), "%s%s [%s: %s]", named, more, source, text)
    else:
        log.log(level, "%s [%s]", text, source)


class Throttle:
    """Admits one event of a kind per ``interval`` seconds and counts the others."""

    def __init__(
        self, interval: float = HANDSHAKE_LOG_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[str, tuple[float, int]] = {}

    def admit(self, kind: str) -> int | None:
        """None if an event of ``kind`` was admitted less than ``interval`` ago (this one
        is counted); else how many were counted since the last admitted one."""
        now = self._clock()
        with self._lock:
            last, quiet = self._kinds.get(kind, (-math.inf, 0))
            if now - last < self.interval:
                self._kinds[kind] = (last, quiet + 1)
                return None
            self._kinds[kind] = (now, 0)
            return quiet


_handshakes = Throttle()


def _relay(read_end: int, server: bool) -> None:
    with io.TextIOWrapper(io.FileIO(read_end, "r"), encoding="utf-8", errors="replace") as pipe:
        for line in pipe:
            try:
                relog(line, server)
            except Exception:
                continue


__all__ = ["HANDSHAKE_LOG_INTERVAL", "Throttle", "relog", "route_grpc_logs"]

"""gRPC's own log lines, in the server's log format.

gRPC's C core writes its log lines (``I1125 07:11:38.528389 4189
ssl_transport_security.cc:2563] Handshake failed ...``) straight to file descriptor
2, past Python's ``logging``: with ``--log-format json`` they broke the one-object-a-
line stream, and a TLS handshake failure was OpenSSL jargon. ``route_grpc_logs``
points descriptor 2 at a pipe, moves Python's own ``sys.stderr`` to a copy of the
real one (so the log handler still writes there), and re-logs every line from the
pipe through the ``grpc`` logger: glog's level letter becomes the record's level, and
a TLS handshake failure is named (``holdfast.proto.tls_failures``) with the raw line
after it. Only the command lines call it (the servers', the pool's, the admin
command's): a library must not take a process's stderr.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import threading

from holdfast.proto.tls_failures import SERVER_FAILURES, name_failure

log = logging.getLogger("holdfast.grpc")

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
        log.log(max(level, logging.WARNING), "%s [%s: %s]", named, source, text)
    else:
        log.log(level, "%s [%s]", text, source)


def _relay(read_end: int, server: bool) -> None:
    with io.TextIOWrapper(io.FileIO(read_end, "r"), encoding="utf-8", errors="replace") as pipe:
        for line in pipe:
            try:
                relog(line, server)
            except Exception:
                continue


__all__ = ["relog", "route_grpc_logs"]

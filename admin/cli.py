"""``holdfast``: operate a broker's queues from a shell.

::

    holdfast [--address HOST:PORT] queues [--json]
    holdfast stats URI [--json]
    holdfast peek URI [-n N] [--json]
    holdfast purge URI
    holdfast delete URI
    holdfast policy set URI [--max-deliveries N] [--ttl SECONDS] [--dead-letter URI]
                            [--max-messages N] [--max-bytes N] [--redirect URI]
    holdfast policy show URI [--json]
    holdfast dlq replay URI
    holdfast certs dev DIR [--host NAME]... [--force]

The connection options ``--address``, ``--timeout``, ``--token``, ``--tls-ca``,
``--tls-cert`` and ``--tls-key`` go before or after the command. ``--address`` is a
broker's listen address (default ``$HOLDFAST_ADDRESS``, then the deprecated
``$HOLDFAST_BROKER_ADDRESS``, then ``127.0.0.1:7700``): the admin service runs on
brokers, not on proxies. ``--token`` defaults to ``$HOLDFAST_TOKEN``. ``policy set``
changes only the fields given (``0`` clears one) and keeps the others; its URI may be
a template, ``hf://<domain>/<prefix>*``, the policy of every queue whose name starts
with the prefix and has none of its own. ``certs dev`` writes development
certificates for TLS and mTLS (``holdfast.admin.certs``); it connects to nothing.

Exit codes (``EXIT_*``): 0 done; 1 any other refusal (the store failed, ``certs
dev`` found its files already there); 2 bad usage or input (an unknown option, a bad
address, URI or file, a policy out of range); 3 the broker cannot be reached or does
not serve the admin service; 4 no such queue; 5 the queue is in use (delete with open
handles); 6 authentication failed (no token, or one the broker does not know); 7 the
token is not allowed to (not an admin token); 130 interrupted; 141 the reader of the
output went away (``holdfast queues | head -1``: nothing is printed about it, as a
command killed by SIGPIPE). Every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from holdfast.admin.commands import COMMANDS
from holdfast.admin.options import EXIT_USAGE, UsageError, connection, parser, say
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import (
    AuthenticationError,
    HoldfastError,
    InvalidArgumentError,
    PermissionDeniedError,
    QueueInUseError,
    QueueNotFoundError,
    TransportError,
)
from holdfast.server.grpc_logs import route_grpc_logs

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4
EXIT_IN_USE = 5
EXIT_AUTHENTICATION = 6
EXIT_PERMISSION = 7
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a command its reader left."""

# The first match wins: AuthenticationError is a TransportError too.
_EXIT_CODES: tuple[tuple[type[HoldfastError], int], ...] = (
    (InvalidArgumentError, EXIT_USAGE),
    (QueueNotFoundError, EXIT_NOT_FOUND),
    (QueueInUseError, EXIT_IN_USE),
    (AuthenticationError, EXIT_AUTHENTICATION),
    (PermissionDeniedError, EXIT_PERMISSION),
    (TransportError, EXIT_UNREACHABLE),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    args = parser().parse_args(argv)
    name = _key(args)
    if argv is None:  # the command line: gRPC's own lines (a TLS handshake) off stderr
        route_grpc_logs(server=False)
    try:
        text = _run(args)
    except UsageError as error:
        say(f"holdfast {name}: {error}")
        return EXIT_USAGE
    except _Failed as failed:
        return failed.code
    except KeyboardInterrupt:
        say(f"holdfast {name}: interrupted")
        return EXIT_INTERRUPTED
    return _emit(text) if text else EXIT_OK


class _Failed(Exception):
    """A failure already reported on stderr, with its exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _run(args: argparse.Namespace) -> str:
    if args.command == "certs":
        return _certs(args)
    settings = connection(args)
    for line in settings.warnings:
        say(line)
    name = _key(args)
    try:
        with AdminClient(
            settings.address,
            timeout=settings.timeout,
            token=settings.token,
            tls_ca=settings.tls_ca,
            tls_cert=settings.tls_cert,
            tls_key=settings.tls_key,
        ) as admin:
            return COMMANDS[name](admin, args)
    except HoldfastError as error:
        code = next((c for kind, c in _EXIT_CODES if isinstance(error, kind)), EXIT_REFUSED)
        where = f" ({settings.address})" if code in (EXIT_UNREACHABLE, EXIT_AUTHENTICATION) else ""
        say(f"holdfast {name}: {_first_line(error)}{where}")
        raise _Failed(code) from None
    except ValueError as error:  # grpc refuses some bad input (a token, PEM) before a call
        raise UsageError(_first_line(error)) from None


def _certs(args: argparse.Namespace) -> str:
    # Imported here: only this command needs the cryptography library.
    from holdfast.admin.certs import (
        CertificatesExistError,
        InvalidHostError,
        make_dev_certificates,
        usage_text,
    )

    try:
        made = make_dev_certificates(Path(args.dir), hosts=args.host, force=args.force)
    except InvalidHostError as error:
        raise UsageError(str(error)) from None
    except CertificatesExistError as error:
        say(f"holdfast certs dev: {error}")
        raise _Failed(EXIT_REFUSED) from None
    except OSError as error:
        where = error.filename or args.dir
        raise UsageError(f"{where}: {error.strerror}") from None
    return usage_text(made)


def _emit(text: str) -> int:
    """Print ``text``; a reader that went away is not an error worth a traceback."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Later flushes (at exit) would fail again: point stdout at /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_CLOSED_PIPE
    return EXIT_OK


def _key(args: argparse.Namespace) -> str:
    action = getattr(args, "action", None)
    return f"{args.command} {action}" if action else str(args.command)


def _first_line(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0]


__all__ = [
    "EXIT_AUTHENTICATION",
    "EXIT_CLOSED_PIPE",
    "EXIT_INTERRUPTED",
    "EXIT_IN_USE",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PERMISSION",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "main",
    "parser",
]

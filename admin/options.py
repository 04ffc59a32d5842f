"""The ``holdfast`` command line: its parser and where each setting comes from.

The connection options (``--address``, ``--timeout``, ``--token``, ``--tls-ca``,
``--tls-cert``, ``--tls-key``) are accepted before the command and after it
(``holdfast --address A queues`` and ``holdfast queues --address A``): every command's
parser repeats them with a suppressed default, so a value given after the command
wins and one given before is never overwritten by a default.

Every parse error is one line on stderr and exit code 2 (``OneLineParser``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from holdfast.proto.credentials import TOKEN_RULE, sendable_token
from holdfast.proto.policy import MAX_TTL
from holdfast.sdk.admin import DEFAULT_TIMEOUT
from holdfast.sdk.options import MAX_SECONDS
from holdfast.server.cli_support import OneLineParser, whole_number
from holdfast.server.serve import split_host_port, version_text

DEFAULT_ADDRESS = "127.0.0.1:7700"
"""The broker's address when neither ``--address`` nor the environment names one."""
ADDRESS_ENV = "HOLDFAST_ADDRESS"
"""The broker's ``HOST:PORT`` for every command (the SDK reads the same variable)."""
DEPRECATED_ADDRESS_ENV = "HOLDFAST_BROKER_ADDRESS"
"""The old name of ``$HOLDFAST_ADDRESS``: still read (with a warning on stderr) when
``$HOLDFAST_ADDRESS`` is not set; removed in the release after 0.1."""
TOKEN_ENV = "HOLDFAST_TOKEN"
"""The admin token for every command when ``--token`` is not given."""

EXIT_USAGE = 2
"""The exit code of a usage error (see ``holdfast.admin.cli``)."""


EXIT_CODES_HELP = """\
exit codes:
  0 done                       5 the queue is in use
  1 refused (store failed)     6 authentication failed (no token, unknown token)
  2 bad usage or input         7 permission denied (not an admin token)
  3 broker unreachable         130 interrupted
  4 no such queue              141 the output's reader went away (| head)"""
"""The end of ``holdfast --help`` (the codes are ``holdfast.admin.cli.EXIT_*``)."""


def _timeout(text: str) -> float:
    """``--timeout``: seconds in (0, MAX_SECONDS]. gRPC turned an infinite or huge one
    into a deadline already past: DEADLINE_EXCEEDED, as if the broker were slow."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {MAX_SECONDS:g} seconds, got {text[:40]}"
        )
    return value


_count = whole_number(0, " (0 clears it)", maximum=2**64 - 1)
"""A policy's count (``--max-deliveries``, ``--max-messages``, ``--max-bytes``):
checked here so the error names the flag, before anything connects (a uint64 on the
wire; ``--max-deliveries`` a uint32)."""
_deliveries = whole_number(0, " (0 clears it)", maximum=2**32 - 1)


def _ttl(text: str) -> float:
    """``--ttl``: seconds in (0, MAX_TTL], or 0 to clear it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= MAX_TTL:
        raise argparse.ArgumentTypeError(
            f"must be in (0, {MAX_TTL:.0f}] seconds (0 clears it), got {text}"
        )
    return value


def _connection_options(parser: argparse.ArgumentParser, default: object) -> None:
    """The options every admin command takes, before or after its name."""
    group = parser.add_argument_group("connection (before or after the command)")
    group.add_argument(
        "--address",
        default=default,
        help=f"the broker's HOST:PORT (default: ${ADDRESS_ENV} or {DEFAULT_ADDRESS})",
    )
    group.add_argument(
        "--timeout",
        type=_timeout,
        default=default,
        help=f"seconds per call (default: {DEFAULT_TIMEOUT:g})",
    )
    group.add_argument("--token", default=default, help=f"an admin token (default: ${TOKEN_ENV})")
    group.add_argument(
        "--tls-ca", metavar="PATH", default=default, help="PEM CA of the broker's certificate"
    )
    group.add_argument(
        "--tls-cert", metavar="PATH", default=default, help="PEM client certificate (mTLS)"
    )
    group.add_argument("--tls-key", metavar="PATH", default=default, help="PEM key of --tls-cert")


def parser() -> argparse.ArgumentParser:
    """The ``holdfast`` argument parser."""
    top = OneLineParser(
        prog="holdfast",
        description="Operate the queues of a Holdfast broker; make development certificates.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=version_text("holdfast"))
    _connection_options(top, None)
    after = OneLineParser(add_help=False)
    _connection_options(after, argparse.SUPPRESS)
    json_flag = OneLineParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing = [after, json_flag]
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("queues", parents=listing, help="list every queue")
    stats = commands.add_parser("stats", parents=listing, help="one queue's figures and policy")
    stats.add_argument("uri")
    peek = commands.add_parser("peek", parents=listing, help="show ready messages")
    peek.add_argument("uri")
    peek.add_argument("-n", type=int, default=10, help="how many (default 10, at most 1000)")
    purge = commands.add_parser("purge", parents=[after], help="remove the ready messages")
    purge.add_argument("uri")
    delete = commands.add_parser("delete", parents=[after], help="delete an unused queue")
    delete.add_argument("uri")
    policy = commands.add_parser("policy", help="show or set a queue's policy")
    policy_commands = policy.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = policy_commands.add_parser("show", parents=listing, help="print the policy")
    show.add_argument("uri")
    set_ = policy_commands.add_parser(
        "set", parents=listing, help="change the given fields (0 clears one)"
    )
    set_.add_argument("uri")
    set_.add_argument("--max-deliveries", type=_deliveries, help="deliveries before dead-lettering")
    set_.add_argument(
        "--ttl", type=_ttl, help="seconds a message may live from its acceptance (then: expired)"
    )
    set_.add_argument("--dead-letter", help="the dead-letter queue's URI ('' clears it)")
    set_.add_argument("--max-messages", type=_count, help="depth limit in messages")
    set_.add_argument("--max-bytes", type=_count, help="depth limit in payload bytes")
    set_.add_argument("--redirect", help="send PUTs to this queue instead ('' clears it)")
    dlq = commands.add_parser("dlq", help="dead-letter queues")
    dlq_commands = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    dlq_commands.add_parser(
        "replay", parents=[after], help="move dead letters back to their original queues"
    ).add_argument("uri")
    certs = commands.add_parser("certs", help="make TLS certificates")
    certs_commands = certs.add_subparsers(dest="action", required=True, metavar="ACTION")
    dev = certs_commands.add_parser(
        "dev", help="a CA, a server and a client certificate for local TLS and mTLS"
    )
    dev.add_argument("dir", help="the folder to write them in (made if missing)")
    dev.add_argument("--force", action="store_true", help="overwrite files already there")
    dev.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="another name or IP of the server certificate (127.0.0.1, ::1 and "
        "localhost are always in it; repeat for more)",
    )
    return top


@dataclass(frozen=True, slots=True)
class Connection:
    """Where and how an admin command connects, every default applied."""

    address: str
    timeout: float
    token: str | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    warnings: tuple[str, ...] = ()
    """Lines to print on stderr before running (a deprecated variable was used)."""


class UsageError(ValueError):
    """A start-up mistake outside the parser (an address, a missing ``--tls-key``)."""


def connection(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Connection:
    """The settings of ``args`` completed from the environment; ``UsageError`` if they
    cannot work."""
    warnings: list[str] = []
    if args.address is not None:
        address, source = args.address, "--address"
    elif environ.get(ADDRESS_ENV):
        address, source = environ[ADDRESS_ENV], f"${ADDRESS_ENV}"
    elif environ.get(DEPRECATED_ADDRESS_ENV):
        address, source = environ[DEPRECATED_ADDRESS_ENV], f"${DEPRECATED_ADDRESS_ENV}"
        warnings.append(
            f"holdfast: warning: ${DEPRECATED_ADDRESS_ENV} is deprecated, "
            f"set ${ADDRESS_ENV} instead"
        )
    else:
        address, source = DEFAULT_ADDRESS, "the default address"
    try:
        split_host_port(address)
    except ValueError as error:
        raise UsageError(f"{source}: {error}") from None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together (mTLS): give both or neither")
    for option, path in (
        ("--tls-ca", args.tls_ca),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
    ):
        if path is not None:
            _check_pem(option, path)
    if args.token is not None:
        token, source = args.token, "--token"
    else:
        token, source = environ.get(TOKEN_ENV) or None, f"${TOKEN_ENV}"
    # gRPC refuses other characters in metadata only at the first call, as INTERNAL.
    if token is not None and not sendable_token(token):
        raise UsageError(f"{source}: {TOKEN_RULE}")
    return Connection(
        address=address,
        timeout=DEFAULT_TIMEOUT if args.timeout is None else args.timeout,
        token=token,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        warnings=tuple(warnings),
    )


def _check_pem(option: str, path: str) -> None:
    """Refuse a file that cannot be read or is not PEM now, in one line: gRPC would
    only fail at the first call, as an unreachable broker."""
    try:
        with open(path, "rb") as file:
            head = file.read(1 << 16)
    except OSError as error:
        raise UsageError(f"{option} {path}: {error.strerror}") from None
    if b"-----BEGIN " not in head:
        raise UsageError(f"{option} {path}: not a PEM file (no -----BEGIN line)")


def say(line: str) -> None:
    """One line on stderr."""
    print(line, file=sys.stderr)


__all__ = [
    "ADDRESS_ENV",
    "DEFAULT_ADDRESS",
    "DEPRECATED_ADDRESS_ENV",
    "TOKEN_ENV",
    "Connection",
    "OneLineParser",
    "UsageError",
    "connection",
    "parser",
    "say",
]

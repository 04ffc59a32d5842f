"""``holdfast``: operate a broker's queues from a shell.

::

    holdfast --address HOST:PORT queues [--json]
    holdfast stats URI [--json]
    holdfast peek URI [-n N] [--json]
    holdfast purge URI
    holdfast delete URI
    holdfast policy set URI [--max-deliveries N] [--ttl SECONDS] [--dead-letter URI]
                            [--max-messages N] [--max-bytes N] [--redirect URI]
    holdfast policy show URI [--json]
    holdfast dlq replay URI

``--address`` is a broker's listen address (default ``$HOLDFAST_BROKER_ADDRESS`` or
``127.0.0.1:7700``): the admin service runs on brokers, not on proxies. ``policy
set`` changes only the fields given (``0`` clears one) and keeps the others; its URI
may be a template, ``hf://<domain>/<prefix>*``, the policy of every queue whose name
starts with the prefix and has none of its own.

Exit codes: 0 done; 2 bad usage or input (a bad URI, a policy out of range); 3 the
broker cannot be reached or does not serve the admin service; 4 no such queue; 5 the
queue is in use (delete with open handles); 1 any other refusal (the store failed).
Every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from holdfast.admin import render
from holdfast.proto.policy import QueuePolicy
from holdfast.proto.validate import Invalid
from holdfast.sdk.admin import DEFAULT_TIMEOUT, AdminClient
from holdfast.sdk.errors import (
    HoldfastError,
    InvalidArgumentError,
    QueueInUseError,
    QueueNotFoundError,
    TransportError,
)
from holdfast.server.serve import split_host_port, version_text

DEFAULT_ADDRESS = "127.0.0.1:7700"
ADDRESS_ENV = "HOLDFAST_BROKER_ADDRESS"

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4
EXIT_IN_USE = 5

_EXIT_CODES: tuple[tuple[type[HoldfastError], int], ...] = (
    (InvalidArgumentError, EXIT_USAGE),
    (QueueNotFoundError, EXIT_NOT_FOUND),
    (QueueInUseError, EXIT_IN_USE),
    (TransportError, EXIT_UNREACHABLE),
)


def parser() -> argparse.ArgumentParser:
    """The ``holdfast`` argument parser."""
    top = argparse.ArgumentParser(
        prog="holdfast", description="Operate the queues of a Holdfast broker."
    )
    top.add_argument("--version", action="version", version=version_text("holdfast"))
    top.add_argument(
        "--address",
        default=os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS,
        help=f"the broker's HOST:PORT (default: ${ADDRESS_ENV} or {DEFAULT_ADDRESS})",
    )
    top.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per call (default: 10)"
    )
    top.add_argument("--token", help="an admin token (default: $HOLDFAST_TOKEN)")
    top.add_argument("--tls-ca", metavar="PATH", help="PEM CA of the broker's certificate")
    top.add_argument("--tls-cert", metavar="PATH", help="PEM client certificate (mTLS)")
    top.add_argument("--tls-key", metavar="PATH", help="PEM key of --tls-cert")
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print JSON for scripts")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("queues", parents=[json_flag], help="list every queue")
    for name, text in (("stats", "one queue's figures and policy"),):
        commands.add_parser(name, parents=[json_flag], help=text).add_argument("uri")
    peek = commands.add_parser("peek", parents=[json_flag], help="show ready messages")
    peek.add_argument("uri")
    peek.add_argument("-n", type=int, default=10, help="how many (default 10, at most 1000)")
    commands.add_parser("purge", help="remove the ready messages").add_argument("uri")
    commands.add_parser("delete", help="delete an unused queue").add_argument("uri")
    policy = commands.add_parser("policy", help="show or set a queue's policy")
    policy_commands = policy.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = policy_commands.add_parser("show", parents=[json_flag], help="print the policy")
    show.add_argument("uri")
    set_ = policy_commands.add_parser(
        "set", parents=[json_flag], help="change the given fields (0 clears one)"
    )
    set_.add_argument("uri")
    set_.add_argument("--max-deliveries", type=int, help="deliveries before dead-lettering")
    set_.add_argument("--ttl", type=float, help="seconds a ready message may wait")
    set_.add_argument("--dead-letter", help="the dead-letter queue's URI ('' clears it)")
    set_.add_argument("--max-messages", type=int, help="depth limit in messages")
    set_.add_argument("--max-bytes", type=int, help="depth limit in payload bytes")
    set_.add_argument("--redirect", help="send PUTs to this queue instead ('' clears it)")
    dlq = commands.add_parser("dlq", help="dead-letter queues")
    dlq_commands = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    dlq_commands.add_parser(
        "replay", help="move dead letters back to their original queues, once each"
    ).add_argument("uri")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    args = parser().parse_args(argv)
    try:
        split_host_port(args.address)
    except ValueError as error:
        print(f"holdfast {args.command}: --address: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with AdminClient(
            args.address,
            timeout=args.timeout,
            token=args.token,
            tls_ca=args.tls_ca,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        ) as admin:
            text = _COMMANDS[_key(args)](admin, args)
    except HoldfastError as error:
        code = next((c for kind, c in _EXIT_CODES if isinstance(error, kind)), EXIT_REFUSED)
        where = f" ({args.address})" if code == EXIT_UNREACHABLE else ""
        print(f"holdfast {args.command}: {_first_line(error)}{where}", file=sys.stderr)
        return code
    except ValueError as error:  # an invalid address: grpc refuses it before any call
        print(f"holdfast {args.command}: {_first_line(error)}", file=sys.stderr)
        return EXIT_USAGE
    if text:
        print(text)
    return EXIT_OK


def _key(args: argparse.Namespace) -> str:
    action = getattr(args, "action", None)
    return f"{args.command} {action}" if action else str(args.command)


def _first_line(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0]


def _queues(admin: AdminClient, args: argparse.Namespace) -> str:
    queues = admin.queues()
    if args.json:
        return render.as_json([render.info_dict(q) for q in queues])
    return render.queues_table(queues)


def _stats(admin: AdminClient, args: argparse.Namespace) -> str:
    info = admin.stats(args.uri)
    return render.as_json(render.info_dict(info)) if args.json else render.stats_text(info)


def _peek(admin: AdminClient, args: argparse.Namespace) -> str:
    if not 1 <= args.n <= 1000:
        raise InvalidArgumentError(f"-n must be in [1, 1000], got {args.n}")
    messages = admin.peek(args.uri, args.n)
    if args.json:
        return render.as_json([render.peek_dict(m) for m in messages])
    return render.peek_table(messages)


def _purge(admin: AdminClient, args: argparse.Namespace) -> str:
    return f"purged {admin.purge(args.uri)} messages from {args.uri}"


def _delete(admin: AdminClient, args: argparse.Namespace) -> str:
    return f"deleted {args.uri} ({admin.delete(args.uri)} messages)"


def _policy_show(admin: AdminClient, args: argparse.Namespace) -> str:
    policy = admin.policy(args.uri)
    if args.json:
        return render.as_json(render.policy_dict(policy))
    return render.policy_text(policy)


def _policy_set(admin: AdminClient, args: argparse.Namespace) -> str:
    try:
        current = admin.policy(args.uri)
    except QueueNotFoundError:
        current = QueuePolicy()  # setting a policy creates the queue
    changes = {
        "max_deliveries": args.max_deliveries,
        "ttl": args.ttl,
        "dead_letter": args.dead_letter,
        "max_messages": args.max_messages,
        "max_bytes": args.max_bytes,
        "redirect": args.redirect,
    }
    fields = {
        "max_deliveries": current.max_deliveries,
        "ttl": current.ttl,
        "dead_letter": current.dead_letter,
        "max_messages": current.max_messages,
        "max_bytes": current.max_bytes,
        "redirect": current.redirect,
    }
    for name, value in changes.items():
        if value is not None:
            fields[name] = value or None  # 0 (or '') clears the field
    try:
        policy = QueuePolicy(**fields)  # type: ignore[arg-type]
    except Invalid as error:
        raise InvalidArgumentError(error.message) from None
    updated = admin.set_policy(args.uri, policy)
    if args.json:
        return render.as_json(render.policy_dict(updated))
    return f"{args.uri}: {render.policy_text(updated)}"


def _dlq_replay(admin: AdminClient, args: argparse.Namespace) -> str:
    count, note = admin.replay_dead_letters(args.uri)
    text = f"replayed {count} messages from {args.uri}"
    return f"{text}; {note}" if note else text


_COMMANDS: dict[str, Callable[[AdminClient, argparse.Namespace], str]] = {
    "queues": _queues,
    "stats": _stats,
    "peek": _peek,
    "purge": _purge,
    "delete": _delete,
    "policy show": _policy_show,
    "policy set": _policy_set,
    "dlq replay": _dlq_replay,
}


__all__ = ["main", "parser"]

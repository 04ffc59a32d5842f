"""What each ``holdfast`` admin command does with an ``AdminClient``: the calls and
the text they print (tables and JSON from ``render``). ``COMMANDS`` maps a command's
name (``"policy set"``) to its function."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from holdfast.admin import render
from holdfast.proto.policy import QueuePolicy
from holdfast.proto.validate import Invalid
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import InvalidArgumentError, QueueNotFoundError
from holdfast.server.cli_support import name_flags

POLICY_FLAGS = {
    "max_deliveries": "--max-deliveries",
    "ttl": "--ttl",
    "dead_letter": "--dead-letter",
    "max_messages": "--max-messages",
    "max_bytes": "--max-bytes",
    "redirect": "--redirect",
}
"""Fields of ``QueuePolicy`` and the ``policy set`` flags that set them."""


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
        raise InvalidArgumentError(name_flags(error.message, POLICY_FLAGS)) from None
    updated = admin.set_policy(args.uri, policy)
    if args.json:
        return render.as_json(render.policy_dict(updated))
    return f"{args.uri}: {render.policy_text(updated)}"


def _dlq_replay(admin: AdminClient, args: argparse.Namespace) -> str:
    count, note = admin.replay_dead_letters(args.uri)
    text = f"replayed {count} messages from {args.uri}"
    return f"{text}; {note}" if note else text


COMMANDS: dict[str, Callable[[AdminClient, argparse.Namespace], str]] = {
    "queues": _queues,
    "stats": _stats,
    "peek": _peek,
    "purge": _purge,
    "delete": _delete,
    "policy show": _policy_show,
    "policy set": _policy_set,
    "dlq replay": _dlq_replay,
}
"""Each admin command by name (``"policy set"``): it calls the broker and returns the
text to print."""

__all__ = ["COMMANDS"]

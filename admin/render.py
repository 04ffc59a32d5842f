"""How the ``holdfast`` command prints: aligned tables for people, JSON for scripts."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk.admin import PeekedMessage, QueueInfo

PAYLOAD_PREVIEW = 60
"""Characters of a payload a table shows."""


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers aligned right."""
    cells = [[str(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        all(isinstance(row[i], int | float) for row in rows) and bool(rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if right else v.ljust(w)
            for v, w, right in zip(values, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def policy_dict(policy: QueuePolicy) -> dict[str, Any]:
    """A policy as JSON-ready fields (unset ones are ``null``)."""
    return {
        "max_deliveries": policy.max_deliveries,
        "ttl_seconds": policy.ttl,
        "dead_letter": policy.dead_letter,
        "max_messages": policy.max_messages,
        "max_bytes": policy.max_bytes,
        "redirect": policy.redirect,
    }


def policy_text(policy: QueuePolicy) -> str:
    """``max-deliveries=5 ttl=60s dead-letter=hf://...`` or ``none``."""
    parts = []
    if policy.max_deliveries is not None:
        parts.append(f"max-deliveries={policy.max_deliveries}")
    if policy.ttl is not None:
        parts.append(f"ttl={policy.ttl:g}s")
    if policy.dead_letter is not None:
        parts.append(f"dead-letter={policy.dead_letter}")
    if policy.max_messages is not None:
        parts.append(f"max-messages={policy.max_messages}")
    if policy.max_bytes is not None:
        parts.append(f"max-bytes={policy.max_bytes}")
    if policy.redirect is not None:
        parts.append(f"redirect={policy.redirect}")
    return " ".join(parts) or "none"


def info_dict(info: QueueInfo) -> dict[str, Any]:
    """A queue's figures as JSON-ready fields."""
    return {
        "uri": info.uri,
        "ready": info.ready,
        "unconfirmed": info.unconfirmed,
        "bytes": info.bytes,
        "consumers": info.consumers,
        "handles": info.handles,
        "oldest_age_seconds": round(info.oldest_age, 3),
        "accepted": info.accepted,
        "redelivered": info.redelivered,
        "rejected": info.rejected,
        "dead_lettered": info.dead_lettered,
        "expired": info.expired,
        "policy": policy_dict(info.policy),
    }


def queues_table(queues: Sequence[QueueInfo]) -> str:
    """``holdfast queues``: one line per queue."""
    if not queues:
        return "no queues"
    headers = ("URI", "READY", "UNCONFIRMED", "BYTES", "CONSUMERS", "OLDEST_S", "DEAD")
    rows = [
        (
            q.uri,
            q.ready,
            q.unconfirmed,
            q.bytes,
            q.consumers,
            round(q.oldest_age, 1),
            q.dead_lettered,
        )
        for q in queues
    ]
    return table(headers, rows)


def stats_text(info: QueueInfo) -> str:
    """``holdfast stats URI``: one field a line."""
    fields = info_dict(info)
    fields["policy"] = policy_text(info.policy)
    width = max(len(name) for name in fields)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in fields.items())


def preview(payload: bytes) -> str:
    """A payload as text if it is UTF-8, else as bytes; cut to ``PAYLOAD_PREVIEW``."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = repr(payload)
    text = text.replace("\n", "\\n")
    if len(text) > PAYLOAD_PREVIEW:
        text = text[:PAYLOAD_PREVIEW] + f"... ({len(payload)} bytes)"
    return text


def peek_dict(message: PeekedMessage) -> dict[str, Any]:
    """A peeked message as JSON-ready fields (payload in base64, and as text if UTF-8)."""
    entry: dict[str, Any] = {
        "guid": message.guid.hex(),
        "delivery_count": message.delivery_count,
        "age_seconds": round(message.age, 3),
        "properties": dict(message.properties),
        "payload_base64": base64.b64encode(message.payload).decode("ascii"),
    }
    with contextlib.suppress(UnicodeDecodeError):
        entry["payload_text"] = message.payload.decode("utf-8")
    return entry


def peek_table(messages: Sequence[PeekedMessage]) -> str:
    """``holdfast peek URI``: one line per message."""
    if not messages:
        return "no ready messages"
    headers = ("GUID", "DELIVERIES", "AGE_S", "PROPERTIES", "PAYLOAD")
    rows = [
        (
            m.guid.hex(),
            m.delivery_count,
            round(m.age, 1),
            ",".join(f"{k}={v}" for k, v in sorted(m.properties.items())) or "-",
            preview(m.payload),
        )
        for m in messages
    ]
    return table(headers, rows)


def as_json(value: Any) -> str:
    """Stable, indented JSON."""
    return json.dumps(value, indent=2, sort_keys=True)


__all__ = [
    "as_json",
    "info_dict",
    "peek_dict",
    "peek_table",
    "policy_dict",
    "policy_text",
    "queues_table",
    "stats_text",
    "table",
]

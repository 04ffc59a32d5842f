"""Queue policies: what the broker does with a queue's messages beyond delivering them.

A ``QueuePolicy`` is set per queue by an operator (``holdfast policy set``) and kept by
the broker's store (the sqlite store persists it; the memory store keeps it for the process's
life). Every field is optional; ``None`` means no limit (two more rules are set per message,
by properties the PUT carries: ``x-ttl-ms``, a *pickup* TTL that applies until the
message's first delivery, and ``x-dead-letter-notify``, a queue told with a notice
when the message is dead-lettered; request/reply sets both):

- ``max_deliveries``: a message PUSHed this many times is not PUSHed again; it is
  dead-lettered with reason ``delivery-limit`` (a poison message stops looping);
- ``ttl``: seconds from a message's acceptance; past it, a message is dead-lettered with
  reason ``expired`` instead of being delivered, and one a consumer holds (which does not
  expire while held) when it is released (``holdfast.broker.lifecycle``);
- ``dead_letter``: the queue dead-lettered messages move to, with the properties
  ``x-death-reason``, ``x-original-uri`` and ``x-delivery-count``; without it they are
  dropped and counted (``holdfast_dead_letters_dropped_total``);
- ``redirect``: PUTs to the queue are enqueued to that queue instead (keyed worker
  pools send requests for a key with no bound queue to their orphan queue);
- ``max_messages`` / ``max_bytes``: the depth limit. A PUT past it is answered
  ``STATUS_QUEUE_FULL``: the SDK keeps the message and retries, and ``post()`` waits
  and then raises ``BrokerBusyError`` like at the high watermark. Nothing is dropped.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from holdfast.proto import pb
from holdfast.proto.validate import (
    DEAD_LETTER_NOTIFY,
    PICKUP_TTL,
    Invalid,
    parse_queue_uri,
)

REASON_DELIVERY_LIMIT = "delivery-limit"
REASON_EXPIRED = "expired"
REASON_REJECTED = "rejected"
DEATH_REASONS = (REASON_DELIVERY_LIMIT, REASON_EXPIRED, REASON_REJECTED)
"""The values of ``x-death-reason``."""

DEATH_REASON = "x-death-reason"
ORIGINAL_URI = "x-original-uri"
DELIVERY_COUNT = "x-delivery-count"
"""Properties a dead-lettered message carries (the first two are fixed names)."""

DEAD_GUID = "x-dead-guid"
"""On a dead-letter notice: the hex GUID of the message that died."""

_NOTICE_NAMESPACE = b"holdfast-dead-letter-notice/1:"


def dead_letter_notice_guid(guid: bytes) -> bytes:
    """The GUID of the notice sent to a message's ``x-dead-letter-notify`` queue: a
    UUIDv8 (RFC 9562) of a SHA-256, so the notice of one message is one GUID."""
    digest = bytearray(hashlib.sha256(_NOTICE_NAMESPACE + guid).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x80
    digest[8] = (digest[8] & 0x3F) | 0x80
    return bytes(digest)


ORIGINAL_GUID = "x-original-guid"
"""On a dead letter renamed because its dead-letter queue already held its GUID
(``dead_letter_guid``): the hex GUID it had in ``x-original-uri``."""

_DEAD_LETTER_NAMESPACE = b"holdfast-dead-letter/1:"


def dead_letter_guid(origin_uri: str, guid: bytes, attempt: int) -> bytes:
    """The GUID a dead letter from ``origin_uri`` takes in a dead-letter queue that
    already holds ``guid``: the first ``attempt`` (1, 2, ...) whose GUID the queue does
    not hold. Dedup is per queue, so two queues may both dead-letter one GUID into one
    dead-letter queue; neither may be lost, and a CONFIRM by GUID must name one
    message. A UUIDv5-shaped SHA-1 (RFC 9562) so the Redis store's Lua computes the
    same GUID (``redis.sha1hex``)."""
    name = _DEAD_LETTER_NAMESPACE + origin_uri.encode() + b"\n" + guid + b"\n"
    digest = bytearray(hashlib.sha1(name + str(attempt).encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    return bytes(digest)


MAX_TTL = 10 * 365 * 86400.0
"""The longest TTL accepted (ten years): anything longer is a mistake."""


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """A queue's limits and dead-letter queue (see the module docstring)."""

    max_deliveries: int | None = None
    ttl: float | None = None
    """Seconds."""
    dead_letter: str | None = None
    """``hf://<domain>/<queue>``."""
    max_messages: int | None = None
    max_bytes: int | None = None
    redirect: str | None = None
    """PUTs to the queue go to this queue instead (one hop, deduplicated there)."""

    def __post_init__(self) -> None:
        for name in ("max_deliveries", "max_messages", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise Invalid(pb.STATUS_INVALID_ARGUMENT, f"{name} must be a positive integer")
        if self.max_deliveries is not None and self.max_deliveries >= 2**32:
            raise Invalid(pb.STATUS_INVALID_ARGUMENT, "max_deliveries must be below 2**32")
        if self.ttl is not None and not 0 < self.ttl <= MAX_TTL:
            raise Invalid(pb.STATUS_INVALID_ARGUMENT, f"ttl must be in (0, {MAX_TTL:.0f}] seconds")
        if self.dead_letter is not None:
            parse_queue_uri(self.dead_letter)
        if self.redirect is not None:
            parse_queue_uri(self.redirect)

    @property
    def empty(self) -> bool:
        """True when the policy sets nothing (the queue behaves as if it had none)."""
        return self == NO_POLICY

    @property
    def limits_depth(self) -> bool:
        """True when PUTs must be checked against a depth limit."""
        return self.max_messages is not None or self.max_bytes is not None

    def check_for(self, uri: str) -> None:
        """Refuse a policy that cannot work for the queue at ``uri``."""
        # A template's dead-letter queue that the template covers would be its own
        # dead-letter queue (its dead letters moved into themselves).
        if self.dead_letter is not None and (
            self.dead_letter == uri or template_matches(uri, self.dead_letter)
        ):
            covered = f" (the template {uri} covers it)" if is_template(uri) else ""
            raise Invalid(
                pb.STATUS_INVALID_ARGUMENT,
                f"{self.dead_letter} cannot be its own dead-letter queue{covered}",
            )
        if self.redirect is not None and (
            self.redirect == uri or template_matches(uri, self.redirect)
        ):
            raise Invalid(pb.STATUS_INVALID_ARGUMENT, f"{uri} cannot redirect to itself")

    def to_wire(self) -> pb.QueuePolicy:
        """The policy as a ``holdfast.v1.QueuePolicy`` (0 / empty for unset fields)."""
        return pb.QueuePolicy(
            max_deliveries=self.max_deliveries or 0,
            ttl_ms=round(self.ttl * 1000) if self.ttl is not None else 0,
            dead_letter_uri=self.dead_letter or "",
            max_messages=self.max_messages or 0,
            max_bytes=self.max_bytes or 0,
            redirect_uri=self.redirect or "",
        )

    @classmethod
    def from_wire(cls, wire: pb.QueuePolicy) -> QueuePolicy:
        """Parse a wire policy; raises ``Invalid`` for values out of range."""
        return cls(
            max_deliveries=wire.max_deliveries or None,
            ttl=wire.ttl_ms / 1000 if wire.ttl_ms else None,
            dead_letter=wire.dead_letter_uri or None,
            max_messages=wire.max_messages or None,
            max_bytes=wire.max_bytes or None,
            redirect=wire.redirect_uri or None,
        )

    def to_json(self) -> str:
        """Compact JSON of the set fields (how the sqlite store keeps it)."""
        return json.dumps(
            {k: v for k, v in asdict(self).items() if v is not None}, separators=(",", ":")
        )

    @classmethod
    def from_json(cls, text: str) -> QueuePolicy:
        """Read back ``to_json``; raises ``ValueError`` if it does not parse."""
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a queue policy must be a JSON object")
        try:
            return cls(**data)
        except (TypeError, Invalid) as error:
            raise ValueError(f"unreadable queue policy {text[:80]!r}: {error}") from None


TEMPLATE_MARK = "*"
"""A URI ending in it names a policy template: ``hf://<domain>/<prefix>*``."""


def is_template(uri: str) -> bool:
    """Whether ``uri`` names a policy template rather than a queue."""
    return uri.endswith(TEMPLATE_MARK)


def check_policy_uri(uri: str) -> None:
    """Refuse (``InvalidUri``) what is neither a queue URI nor a template URI (a queue
    URI whose last character ``*`` stands for any rest of the queue name)."""
    if isinstance(uri, str) and is_template(uri):
        parse_queue_uri(uri[: -len(TEMPLATE_MARK)])
    else:
        parse_queue_uri(uri)


def template_matches(template: str, uri: str) -> bool:
    """Whether the template URI ``template`` covers the queue ``uri``."""
    return is_template(template) and uri.startswith(template[: -len(TEMPLATE_MARK)])


NO_POLICY = QueuePolicy()
"""The policy of a queue nobody set one for."""

__all__ = [
    "DEAD_GUID",
    "DEAD_LETTER_NOTIFY",
    "DEATH_REASON",
    "DEATH_REASONS",
    "DELIVERY_COUNT",
    "MAX_TTL",
    "NO_POLICY",
    "ORIGINAL_GUID",
    "ORIGINAL_URI",
    "PICKUP_TTL",
    "REASON_DELIVERY_LIMIT",
    "REASON_EXPIRED",
    "REASON_REJECTED",
    "TEMPLATE_MARK",
    "QueuePolicy",
    "check_policy_uri",
    "dead_letter_guid",
    "dead_letter_notice_guid",
    "is_template",
    "template_matches",
]

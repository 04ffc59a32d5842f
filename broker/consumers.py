"""Consumers: queue handles opened with read, their flow limits, and where their
PUSHes go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from holdfast.broker.store import StoredMessage
from holdfast.proto import pb
from holdfast.proto.limits import DEFAULT_MAX_UNCONFIRMED_BYTES, DEFAULT_MAX_UNCONFIRMED_MESSAGES

Q = TypeVar("Q")
"""The queue type of a store (``broker.queues.Queue``, ``broker.redis.queues.RedisQueue``)."""


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """How much a consumer may hold unconfirmed. Delivery to it stops while it holds
    ``max_messages`` messages or ``max_bytes`` payload bytes; 0 pauses it."""

    max_messages: int = DEFAULT_MAX_UNCONFIRMED_MESSAGES
    max_bytes: int = DEFAULT_MAX_UNCONFIRMED_BYTES

    @classmethod
    def from_wire(cls, options: pb.QueueOptions | None) -> FlowLimits:
        """The limits in ``options``, or the defaults when the message is absent."""
        if options is None:
            return cls()
        return cls(options.max_unconfirmed_messages, options.max_unconfirmed_bytes)


class PushSink(Protocol):
    """Where a consumer's PUSHes go: the outbox of the session that owns it."""

    def push(self, queue_id: int, message: StoredMessage, delivery_count: int) -> None:
        """Queue a PUSH of ``message`` to the client under handle ``queue_id``."""
        ...

    def revoke(self, queue_id: int, guids: list[bytes]) -> None:
        """Tell the client that its deliveries ``guids`` under ``queue_id`` are void
        (the node lost its lease: they will be delivered again, once)."""
        ...


class Consumer:
    """A queue handle opened with read: receives PUSHes within its flow limits."""

    __slots__ = ("limits", "queue_id", "sink", "unconfirmed", "unconfirmed_bytes")

    def __init__(self, queue_id: int, sink: PushSink, limits: FlowLimits) -> None:
        self.queue_id = queue_id
        self.sink = sink
        self.limits = limits
        self.unconfirmed: dict[bytes, StoredMessage] = {}
        """PUSHed, not yet confirmed, in delivery order (dicts keep insertion order)."""
        self.unconfirmed_bytes = 0

    def has_room(self) -> bool:
        """Whether the consumer is under both of its limits."""
        limits = self.limits
        return (
            len(self.unconfirmed) < limits.max_messages
            and self.unconfirmed_bytes < limits.max_bytes
        )

    def take(self, guid: bytes) -> StoredMessage | None:
        """Remove ``guid`` from what this consumer holds, if it holds it."""
        message = self.unconfirmed.pop(guid, None)
        if message is not None:
            self.unconfirmed_bytes -= len(message.payload)
        return message


@dataclass(slots=True, eq=False)
class QueueHandle(Generic[Q]):
    """A queue as one session opened it, under the session's ``queue_id``."""

    queue_id: int
    queue: Q
    read: bool
    write: bool
    consumer: Consumer | None
    """Set when opened with read."""


__all__ = ["Consumer", "FlowLimits", "PushSink", "QueueHandle"]

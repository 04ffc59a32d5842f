"""The values the SDK hands to applications: ``AckStatus``, ``Ack`` and ``Message``."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from holdfast.proto.limits import MAX_REJECT_DELAY_MS
from holdfast.sdk.errors import AlreadySettledError, InvalidArgumentError


class AckStatus(enum.Enum):
    """The outcome of one PUT, reported exactly once per PUT.

    ``SUCCESS`` means the message is in the queue (a replay the broker recognised
    by GUID is a success too). ``UNKNOWN`` means the SDK cannot tell: the message
    may or may not be in the queue (also when the broker found the PUT too old to
    recognise a replay of it). A broker that pushes back (``STATUS_HISTORY_FULL``,
    its GUID history at its memory bound) gives no outcome: the SDK keeps the PUT
    and retransmits it later. Every other status means this PUT was not enqueued:

    - ``CONFLICT``: the broker knows the GUID with a different payload or
      properties; the original message stays as it was;
    - the others: the PUT was refused for what it is, or could not be stored.

    Wire statuses are mapped to these in one place, ``holdfast.sdk.statuses``.
    """

    SUCCESS = "SUCCESS"
    UNKNOWN = "UNKNOWN"
    CONFLICT = "CONFLICT"
    INVALID_GUID = "INVALID_GUID"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    INVALID_PROPERTIES = "INVALID_PROPERTIES"
    NOT_WRITABLE = "NOT_WRITABLE"
    UNKNOWN_QUEUE = "UNKNOWN_QUEUE"
    STORE_ERROR = "STORE_ERROR"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    """The token may not make a write this PUT asks for (a dead-letter notice to, or a
    redirect into, a domain it may not write)."""
    REFUSED = "REFUSED"

    @property
    def ok(self) -> bool:
        """True for ``SUCCESS``."""
        return self is AckStatus.SUCCESS


@dataclass(frozen=True, slots=True)
class Ack:
    """The broker's answer to one PUT (or the SDK's, for ``UNKNOWN``)."""

    guid: uuid.UUID
    """The GUID ``post()`` returned for the PUT."""
    status: AckStatus
    """What became of the PUT."""
    queue_uri: str
    """The queue the PUT was posted to."""


class Rejection(NamedTuple):
    """How a message is given back: ``Message.reject`` arguments."""

    requeue: bool
    delay: float


class Settler(Protocol):
    """What settles a delivered message: CONFIRM (``reject`` None) or REJECT."""

    def __call__(self, message: Message, reject: Rejection | None = None) -> None:
        """Send the CONFIRM or REJECT of ``message`` (or raise why it cannot leave)."""
        ...


@dataclass(slots=True, eq=False)
class Message:
    """A message PUSHed to a consumer. Call ``confirm()`` once it is processed."""

    guid: uuid.UUID
    """The GUID its producer assigned (the same on every redelivery)."""
    payload: bytes
    """The message body."""
    properties: Mapping[str, str]
    """String properties the producer attached."""
    delivery_count: int
    """1 on first delivery, +1 on every redelivery."""
    queue_uri: str
    """The queue it came from."""
    _confirmer: Settler = field(repr=False)
    _queue_id: int = field(repr=False)
    _generation: int = field(repr=False)
    _settled: bool = field(default=False, repr=False)
    accepted_at: float = 0.0
    """When the broker accepted it (seconds since the epoch, this client's clock): the
    arrival time minus the age the broker gave the PUSH, so it is only as right as the
    two clocks' rates (not their offset); 0.0 if the message was made without one."""
    _span: Any = field(default=None, repr=False)
    """Its OpenTelemetry ``process`` span, if one is recording (``holdfast.sdk.tracing``)."""

    def confirm(self) -> None:
        """Tell the broker the message is processed, so it is removed from the queue.

        Raises ``ConfirmDroppedError`` when the link is down or the message was
        delivered on an earlier connection: CONFIRMs are never buffered, and the
        broker will redeliver the message; ``AlreadySettledError`` (one of those) when
        this delivery was confirmed or rejected already, and nothing is sent.
        """
        if self._settled:
            raise _already_settled(self)
        self._confirmer(self)
        self._settled = True

    def reject(self, requeue: bool = True, delay: float = 0.0) -> None:
        """Give the message back instead of confirming it.

        With ``requeue`` it returns to the front of its queue (after ``delay``
        seconds) and is delivered again with ``delivery_count`` one higher; a queue
        whose policy sets a delivery limit dead-letters it once the limit is reached.
        Without, it is dead-lettered at once with ``x-death-reason: rejected`` (or
        dropped and counted if its queue has no dead-letter queue). Raises like
        ``confirm()`` when the REJECT cannot leave; the broker then redelivers it.
        ``delay`` is at most an hour (``InvalidArgumentError`` beyond, or if negative).
        """
        if not 0 <= delay <= MAX_REJECT_DELAY_MS / 1000:
            raise InvalidArgumentError(
                f"delay must be in [0, {MAX_REJECT_DELAY_MS // 1000}] seconds, got {delay!r}"
            )
        if self._settled:
            raise _already_settled(self)
        self._confirmer(self, Rejection(requeue, delay))
        self._settled = True

    @property
    def settled(self) -> bool:
        """True once ``confirm()`` or ``reject()`` was sent for this delivery."""
        return self._settled


def _already_settled(message: Message) -> AlreadySettledError:
    return AlreadySettledError(
        f"message {message.guid} (delivery {message.delivery_count}) of "
        f"{message.queue_uri} was confirmed or rejected already: nothing sent"
    )

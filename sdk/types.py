"""The values the SDK hands to applications: ``AckStatus``, ``Ack`` and ``Message``."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


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
    _confirmer: Callable[[Message], None] = field(repr=False)
    _queue_id: int = field(repr=False)
    _generation: int = field(repr=False)

    def confirm(self) -> None:
        """Tell the broker the message is processed, so it is removed from the queue.

        Raises ``ConfirmDroppedError`` when the link is down or the message was
        delivered on an earlier connection: CONFIRMs are never buffered, and the
        broker will redeliver the message.
        """
        self._confirmer(self)

"""A worker's unit of work: one delivery of a request, and the answers it may get."""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass, field

from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import wire
from holdfast.sdk.rpc.values import Request
from holdfast.sdk.types import Ack, AckStatus, Message

log = logging.getLogger("holdfast.sdk.rpc.worker")

Answer = tuple[bytes, dict[str, str]]
"""A reply as posted: payload and properties (reserved ones included)."""


@dataclass(slots=True, eq=False)
class Job:
    """One delivery of a request, from its arrival to the ACK of its reply."""

    request: Request
    message: Message
    reply_to: str
    started: float
    keep_until_ms: int = 0
    """For a durable request (``Session.request_durable``): the wall-clock time, in ms
    since the epoch, until which its reply is kept; 0 for an ordinary call."""
    queue: Queue | None = None
    next_beat: float = 0.0
    answer: Answer | None = field(default=None, repr=False)

    @property
    def durable(self) -> bool:
        """True for a durable request: nobody waits on it, so no heartbeats and no
        check that its caller is still there."""
        return self.keep_until_ms > 0


def confirm(message: Message) -> None:
    """Confirm a request; a CONFIRM dropped with the link is fine (the redelivery is
    answered from the kept reply)."""
    with contextlib.suppress(HoldfastError):
        message.confirm()


def handler_error(guid: uuid.UUID, error: BaseException) -> Answer:
    """The error reply for a handler that raised ``error``."""
    text = wire.error_text(error).encode()
    return text, wire.error_properties(guid, wire.HANDLER_ERROR, type(error).__name__)


def dead_letter(guid: uuid.UUID, reason: str) -> Answer:
    """The error reply for a request that was not picked up in time."""
    text = f"request {guid} was not picked up before it expired".encode()
    return text, wire.error_properties(guid, wire.DEAD_LETTER, "DeadLettered", reason)


def log_reply_ack(key: bytes, ack: Ack) -> None:
    """Log a reply the broker did not take. ``CONFLICT`` is not a failure: the reply
    GUID is derived from the request GUID, so the broker already holds a reply to this
    request (another run's, or the same reply with a fresher keep time for a durable
    request), and that one is the call's answer."""
    if ack.status.ok:
        return
    guid = uuid.UUID(bytes=key)
    if ack.status is AckStatus.CONFLICT:
        log.info("request %s was answered already: the broker keeps the first reply", guid)
    else:
        log.error("reply to %s refused: %s", guid, ack.status.value)

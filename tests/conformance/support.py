"""Helpers of the conformance tests: collect what a consumer is given, read outcomes."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from holdfast.sdk import AckStatus, Message, Session
from holdfast.sdk.admin import PeekedMessage
from holdfast.sdk.errors import QueueNotFoundError
from holdfast.sdk.types import Ack
from tests.conformance.harness import World
from tests.support.waiting import wait_until


class Inbox:
    """An ``on_message`` that keeps every delivery and settles it with ``settle`` (by
    default: leave it held)."""

    def __init__(self, settle: Callable[[Message], None] | None = None) -> None:
        self.messages: list[Message] = []
        self._settle = settle
        self._lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self._lock:
            self.messages.append(message)
        if self._settle is not None:
            self._settle(message)

    def wait(self, count: int, timeout: float = 15.0) -> list[Message]:
        """Wait until ``count`` deliveries arrived; return all so far."""
        wait_until(lambda: len(self.messages) >= count, timeout, f"{count} deliveries")
        with self._lock:
            return list(self.messages)

    def counts(self) -> list[int]:
        """``delivery_count`` of each delivery, in order."""
        with self._lock:
            return [m.delivery_count for m in self.messages]


def post_and_wait(
    session: Session,
    uri: str,
    payload: bytes,
    *,
    guid: uuid.UUID | None = None,
    properties: dict[str, str] | None = None,
) -> AckStatus:
    """Post one PUT and wait for its ACK; its status."""
    queue = session.open_queue(uri, write=True)
    acks: list[Ack] = []
    queue.post(payload, properties=properties, on_ack=acks.append, guid=guid)
    assert session.flush(timeout=15), "no ACK within 15 s"
    queue.close()
    assert len(acks) == 1, acks
    return acks[0].status


def peek(world: World, uri: str) -> list[PeekedMessage]:
    """The ready messages of ``uri`` as the broker holds them (none if it has no such
    queue yet)."""
    try:
        return world.admin.peek(uri, 1000)
    except QueueNotFoundError:
        return []


def wait_ready(world: World, uri: str, count: int, timeout: float = 15.0) -> list[PeekedMessage]:
    """Wait until ``uri`` holds exactly ``count`` ready messages; return them."""
    wait_until(lambda: len(peek(world, uri)) == count, timeout, f"{count} ready in {uri}")
    return peek(world, uri)

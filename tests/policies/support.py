"""Helpers of the policy tests: sessions that reconnect fast, and collecting consumers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from holdfast.sdk import Message, QueueOptions, Session
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import HoldfastError, QueueNotFoundError
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from tests.support.waiting import wait_until

FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.1))
QUICK_RETRY = QueueOptions(retry_delay=0.01, retry_delay_max=0.05)
"""A handler that raises is retried after 10-50 ms, so delivery limits are reached fast."""


class Collector:
    """An ``on_message`` that keeps every message and confirms it (unless told not to)."""

    def __init__(self, confirm: bool = True) -> None:
        self.messages: list[Message] = []
        self._confirm = confirm
        self._lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self._lock:
            self.messages.append(message)
        if self._confirm:
            message.confirm()

    def guids(self) -> list[uuid.UUID]:
        """GUIDs received, in order."""
        with self._lock:
            return [m.guid for m in self.messages]

    def wait_for(self, count: int, timeout: float = 15.0) -> list[Message]:
        """Wait until ``count`` messages arrived; return them."""
        try:
            wait_until(lambda: len(self.messages) >= count, timeout, f"{count} messages")
        except AssertionError as error:
            raise AssertionError(f"{error}: {len(self.messages)} arrived") from None
        with self._lock:
            return list(self.messages)


def post_all(session: Session, uri: str, payloads: list[bytes]) -> list[uuid.UUID]:
    """Post ``payloads`` to ``uri`` and wait until each is ACKed."""
    queue = session.open_queue(uri, write=True)
    guids = [queue.post(p) for p in payloads]
    assert session.flush(timeout=15)
    queue.close()
    return guids


def always_raises(seen: list[Message]) -> Callable[[Message], None]:
    """A handler that records each delivery and fails it."""

    def handle(message: Message) -> None:
        seen.append(message)
        raise RuntimeError("poison")

    return handle


class DeadLetterer:
    """An ``on_message`` that rejects every message without requeue (to the dead-letter
    queue) and sets ``reached`` once it has done so ``after`` times. A REJECT refused
    because the broker is gone is left alone: the broker redelivers that message."""

    def __init__(self, after: int) -> None:
        self.reached = threading.Event()
        self._after = after
        self._done = 0

    def __call__(self, message: Message) -> None:
        try:
            message.reject(requeue=False)
        except HoldfastError:
            return
        self._done += 1
        if self._done == self._after:
            self.reached.set()


def drain(address: str, uris: tuple[str, ...], count: int) -> dict[str, Collector]:
    """Consume ``uris`` through ``address`` until ``count`` messages arrived from them in
    all; the collectors by URI (a message moved between them is in one only)."""
    collectors = {uri: Collector() for uri in uris}
    with Session(address, options=FAST) as session:
        for uri, collector in collectors.items():
            session.open_queue(uri, read=True, on_message=collector)
        wait_until(
            lambda: sum(len(c.messages) for c in collectors.values()) >= count,
            30,
            "every message from one queue or another",
        )
    return collectors


def ready(admin: AdminClient, uri: str) -> int:
    """Ready messages of ``uri`` (0 while the broker does not know it yet)."""
    try:
        return admin.stats(uri).ready
    except QueueNotFoundError:
        return 0

"""The batch read's inbox (``consume``), driven by scripted deliveries: which message it
hands to Spark, which delivery it confirms, and when it owes a CONFIRM.

A delivery belongs to a connection; the SDK refuses the CONFIRM of a delivery made on a
connection that is gone (``ConfirmDroppedError``) and the broker delivers the message
again on the next one. ``_Connections`` plays that part, so the orders that a real
reconnect produces only by timing (a redelivery arriving while its message's row is
being handed to Spark) are written out here step by step.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from holdfast.sdk.errors import ConfirmDroppedError
from holdfast.sdk.spark.batch_read import _Inbox
from holdfast.sdk.types import Message, Rejection

pytestmark = pytest.mark.timeout(30)


class _Connections:
    """Deliveries on numbered connections; only the current one's CONFIRMs leave. Every
    message was accepted before ``cutoff`` (the read's start), however slow the test."""

    def __init__(self, cutoff: float) -> None:
        self.cutoff = cutoff
        self.current = 1
        self.confirmed: list[tuple[uuid.UUID, int]] = []
        """(GUID, connection) of each CONFIRM that left."""

    def deliver(self, guid: uuid.UUID, delivery_count: int = 1) -> Message:
        """A delivery of ``guid`` on the current connection."""
        return Message(
            guid,
            b"payload",
            {},
            delivery_count,
            "hf://test/inbox",
            self._settle,
            1,
            self.current,
            accepted_at=self.cutoff - 1.0,
        )

    def reconnect(self) -> None:
        """The connection is gone; deliveries made on it can no longer be confirmed."""
        self.current += 1

    def _settle(self, message: Message, reject: Rejection | None = None) -> None:
        assert reject is None
        if message._generation != self.current:
            raise ConfirmDroppedError("delivered on an earlier connection")
        self.confirmed.append((message.guid, message._generation))


@pytest.fixture
def inbox() -> Iterator[_Inbox]:
    box = _Inbox(time.time())
    yield box
    box.close()


def test_a_redelivery_while_its_row_is_handed_is_the_one_confirmed(inbox: _Inbox) -> None:
    link = _Connections(inbox.cutoff)
    guid = uuid.uuid4()
    inbox(link.deliver(guid))
    assert [message.guid for message in inbox.take(1, time.monotonic() + 5)] == [guid]
    link.reconnect()
    inbox(link.deliver(guid, delivery_count=2))  # arrives while Spark reads the row
    inbox.confirm_handed()
    # The newer delivery's CONFIRM left; the older one's was never tried, so nothing is
    # owed and the read can end at once.
    assert link.confirmed == [(guid, 2)]
    assert not inbox.owed
    assert not inbox.waiting
    started = time.monotonic()
    assert inbox.take(1, started + 10) == []
    assert time.monotonic() - started < 5, "the read waited for a CONFIRM already settled"


def test_a_redelivery_after_the_chunk_is_confirmed_on_arrival(inbox: _Inbox) -> None:
    link = _Connections(inbox.cutoff)
    guids = [uuid.uuid4() for _ in range(3)]
    for guid in guids:
        inbox(link.deliver(guid))
    chunk = inbox.take(3, time.monotonic() + 5)
    assert [message.guid for message in chunk] == guids
    link.reconnect()
    inbox.confirm_handed()  # every CONFIRM is refused: the connection is gone
    assert inbox.owed == set(guids)
    for guid in guids:
        inbox(link.deliver(guid, delivery_count=2))
    # Each redelivery is confirmed as it comes, never waits to be read again.
    assert link.confirmed == [(guid, 2) for guid in guids]
    assert not inbox.owed
    assert not inbox.waiting


def test_a_redelivery_of_a_waiting_message_replaces_it(inbox: _Inbox) -> None:
    link = _Connections(inbox.cutoff)
    first, second = uuid.uuid4(), uuid.uuid4()
    inbox(link.deliver(first))
    inbox(link.deliver(second))
    link.reconnect()
    inbox(link.deliver(first, delivery_count=2))
    chunk = inbox.take(2, time.monotonic() + 5)
    assert sorted(message.guid for message in chunk) == sorted([first, second])
    assert {message.guid: message.delivery_count for message in chunk} == {first: 2, second: 1}
    inbox.confirm_handed()
    assert link.confirmed == [(first, 2)]  # second's delivery died with its connection
    assert inbox.owed == {second}
    inbox(link.deliver(second, delivery_count=2))
    assert link.confirmed == [(first, 2), (second, 2)]
    assert not inbox.owed and not inbox.waiting


def test_an_owed_confirm_keeps_the_read_open_until_its_redelivery(inbox: _Inbox) -> None:
    link = _Connections(inbox.cutoff)
    guid = uuid.uuid4()
    inbox(link.deliver(guid))
    inbox.take(1, time.monotonic() + 5)
    link.reconnect()
    inbox.confirm_handed()
    started = time.monotonic()

    def wake_early() -> None:  # a wakeup with nothing new, past BACKLOG_QUIET
        with inbox.arrival:
            inbox.arrival.notify_all()

    waker = threading.Timer(1.3, wake_early)
    waker.start()
    try:
        # Quiet for longer than BACKLOG_QUIET, but a CONFIRM is owed: it waits the deadline.
        assert inbox.take(1, started + 2.5) == []
    finally:
        waker.cancel()
    assert time.monotonic() - started >= 2.4


def test_a_delivery_accepted_after_the_read_began_is_left(inbox: _Inbox) -> None:
    link = _Connections(inbox.cutoff)
    late = link.deliver(uuid.uuid4())
    late.accepted_at = inbox.cutoff + 1.0  # accepted after the read began
    inbox(late)
    assert not inbox.waiting
    assert link.confirmed == []

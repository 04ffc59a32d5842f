"""What a queue's calls raise once its session has ended, on both front-ends (issue #33).

A session fails after three connections in a row end in bad frames (here: ACKs with a
status byte no ACK carries). A queue the application never closed then says that the
session failed, and why (``SessionClosedError``), not "the queue is closed"
(``QueueNotOpenError``); after ``Session.close()`` it says the session is closed. And
``queue.close()`` of a queue closed already does nothing, as a second
``Session.close()`` does.
"""

from __future__ import annotations

import asyncio

import pytest

from holdfast.sdk import QueueOptions, Session, SessionClosedError, SessionFailed
from holdfast.sdk import aio as hf_aio
from tests.support.fake_broker import FakeBroker, Script
from tests.support.recorder import EventRecorder
from tests.support.sessions import FAST
from tests.support.waiting import wait_until, wait_until_async

URI = "hf://test/after-the-end"
FAILED = "the session failed: .*connections in a row ended by errors"

pytestmark = pytest.mark.timeout(60)


def _failing_broker() -> FakeBroker:
    """Every connection's ACKs carry status byte 200: the session fails on the third."""
    return FakeBroker(Script(None, bad_ack_status=200))


def test_a_failed_sessions_queue_says_the_session_failed() -> None:
    events = EventRecorder()
    with _failing_broker() as fake:
        session = Session(fake.address, on_event=events, options=FAST)
        try:
            queue = session.open_queue(URI, write=True)
            queue.post(b"never acknowledged")
            wait_until(lambda: events.of(SessionFailed), timeout=30, what="SessionFailed")
            for call in (
                lambda: queue.post(b"x"),
                lambda: queue.post_many([b"x"]),
                lambda: queue.configure(QueueOptions()),
                lambda: session.open_queue(URI, write=True, timeout=3),
            ):
                with pytest.raises(SessionClosedError, match=FAILED) as raised:
                    call()
                assert raised.value.__cause__ is not None  # the failure itself
            queue.close()  # closed by the failure already: nothing to do
            queue.close()
        finally:
            session.close(timeout=5)
        with pytest.raises(SessionClosedError, match=FAILED):
            queue.post(b"x")


def test_a_closed_sessions_queue_says_the_session_is_closed_and_close_is_idempotent() -> None:
    with FakeBroker(Script(None)) as fake:
        session = Session(fake.address, options=FAST)
        queue = session.open_queue(URI, write=True)
        other = session.open_queue(URI + "2", write=True)
        other.close()
        other.close()  # a second close, as a second Session.close(): nothing happens
        session.close(timeout=5)
        session.close()
        with pytest.raises(SessionClosedError, match="the session is closed"):
            queue.post(b"x")
        queue.close()


def test_the_asyncio_front_end_says_the_same() -> None:
    async def main() -> None:
        events = EventRecorder()
        with _failing_broker() as fake:
            session = hf_aio.Session(fake.address, on_event=events, options=FAST)
            try:
                queue = await session.open_queue(URI, write=True)
                await queue.post(b"never acknowledged")
                await wait_until_async(
                    lambda: events.of(SessionFailed), timeout=30, what="SessionFailed"
                )
                with pytest.raises(SessionClosedError, match=FAILED):
                    await queue.post(b"x")
                with pytest.raises(SessionClosedError, match=FAILED):
                    await queue.post_many([b"x"])
                with pytest.raises(SessionClosedError, match=FAILED):
                    await queue.configure(QueueOptions())
                await queue.close()
                await queue.close()
            finally:
                await session.close()
        with FakeBroker(Script(None)) as fake:
            async with hf_aio.Session(fake.address, options=FAST) as session:
                queue = await session.open_queue(URI, write=True)
                await queue.close()
                await queue.close()

    asyncio.run(main())

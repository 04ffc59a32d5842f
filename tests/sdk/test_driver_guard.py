"""A bug in a driver pump, outside any connection, fails the session with ``SessionFailed``
(waiters failed, ``flush()`` returns) instead of ending its thread or task silently."""

from __future__ import annotations

import asyncio

import pytest

from holdfast.proxy.upstream import Upstream
from holdfast.sdk import HoldfastError, QueueOptions, Session, SessionEvent, SessionFailed
from holdfast.sdk.driver.core import DriverCore
from holdfast.sdk.transports import AsyncMemoryTransport, MemoryNetwork, MemoryTransport
from tests.support.recorder import EventRecorder
from tests.support.sessions import FAST

ADDRESS = "nowhere.test:1"
URI = "hf://test/guard"


def break_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the decision after a failed attempt raise, as a bug in the driver would."""

    def ended(self: DriverCore, error: BaseException | None) -> float | None:
        raise RuntimeError("a bug in the driver")

    monkeypatch.setattr(DriverCore, "ended", ended)


@pytest.mark.timeout(30)
def test_a_bug_in_the_threaded_pump_fails_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    break_the_driver(monkeypatch)
    events = EventRecorder()
    transport = MemoryTransport(MemoryNetwork())  # nothing listens: the attempt fails
    with Session(ADDRESS, on_event=events, options=FAST, transport=transport) as session:
        with pytest.raises(HoldfastError, match="a bug in the driver"):
            session.open_queue(URI, write=True, timeout=20)
        assert session.flush()
        assert len(events.of(SessionFailed)) == 1


@pytest.mark.timeout(30)
def test_a_bug_in_the_asyncio_pump_fails_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    break_the_driver(monkeypatch)

    async def scenario() -> None:
        events: list[SessionEvent] = []
        upstream = Upstream(
            [ADDRESS],
            FAST,
            on_acks=lambda acks: None,
            on_event=events.append,
            transport=AsyncMemoryTransport(MemoryNetwork()),
        )
        upstream.start()
        with pytest.raises(HoldfastError, match="a bug in the driver"):
            await upstream.open_queue(
                URI, read=False, write=True, options=QueueOptions(), on_message=None, timeout=20
            )
        assert len([e for e in events if isinstance(e, SessionFailed)]) == 1
        await upstream.stop()

    asyncio.run(scenario())

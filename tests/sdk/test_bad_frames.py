"""Bad frames from the server end a connection, never the session's thread (issue #11 item 7).

A fake broker (real gRPC, frames written by hand) sends a PUSH whose GUID is
3 bytes, or bytes that are no frame at all. The SDK must drop that connection
and reconnect; when every connection ends that way it must fail the session
with ``SessionFailed``, report pending PUTs ``UNKNOWN`` and let ``flush()``
return, instead of leaving a dead connector thread and a ``flush()`` that
never returns.
"""

from __future__ import annotations

import threading

import pytest

from holdfast.sdk import (
    AckStatus,
    ConnectionLost,
    Reconnected,
    Session,
    SessionFailed,
    StateRestored,
)
from holdfast.sdk.driver import MAX_BAD_CONNECTIONS
from tests.support.fake_broker import (
    BadFrame,
    FakeBroker,
    Script,
    push_with_short_guid,
    push_with_stray_properties,
    unparseable,
)
from tests.support.recorder import AckRecorder, EventRecorder, MessageRecorder
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

URI = "hf://test/bad-frames"


@pytest.mark.timeout(60)
def test_a_bad_push_drops_the_connection_and_the_session_reconnects() -> None:
    events, acks = EventRecorder(), AckRecorder()
    with (
        FakeBroker(Script(push_with_short_guid, bad_connections=1)) as fake,
        Session(fake.address, on_event=events, options=FAST) as session,
    ):
        session.open_queue(URI, read=True, on_message=MessageRecorder())
        wait_until(lambda: events.of(Reconnected), timeout=20, what="a reconnect")
        writer = session.open_queue(URI, write=True, on_ack=acks)
        guid = writer.post(b"after the bad frame")
        assert session.flush(timeout=20)
        assert acks.with_status(AckStatus.SUCCESS) == {guid}
        assert not events.of(SessionFailed)
        assert fake.connections == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [200, 0])
def test_an_ack_status_no_ack_carries_drops_the_connection_and_the_puts_go_again(
    bad: int,
) -> None:
    """ACKs with status byte 200 (no Status) or 0 (UNSPECIFIED) used to be taken as
    UNKNOWN outcomes: the PUTs left the buffer, never sent again (issue #33)."""
    events, acks = EventRecorder(), AckRecorder()
    with (
        FakeBroker(Script(None, bad_connections=1, bad_ack_status=bad)) as fake,
        Session(fake.address, on_event=events, options=FAST) as session,
    ):
        writer = session.open_queue(URI, write=True, on_ack=acks)
        guids = {writer.post(b"%d" % i) for i in range(3)}
        assert session.flush(timeout=20)
        wait_until(lambda: len(acks) == 3, timeout=10, what="the three ACKs")
        assert acks.with_status(AckStatus.SUCCESS) == guids
        assert "has status" in str(events.of(ConnectionLost)[0])
        restored = events.of(StateRestored)[0]
        assert isinstance(restored, StateRestored) and restored.retransmitted == 3
        assert fake.connections == 2


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "bad_frame", [push_with_short_guid, push_with_stray_properties, unparseable]
)
def test_repeated_bad_frames_fail_the_session_and_flush_returns(bad_frame: BadFrame) -> None:
    events, acks = EventRecorder(), AckRecorder()
    with FakeBroker(Script(bad_frame, ack_puts=False)) as fake:
        session = Session(fake.address, on_event=events, options=FAST)
        try:
            writer = session.open_queue(URI, write=True, on_ack=acks)
            guid = writer.post(b"never acknowledged")
            session.open_queue(URI, read=True, on_message=MessageRecorder(), timeout=20)
            flushed: list[bool] = []
            # No timeout: it must return because the session fails, not because time ran out.
            flusher = threading.Thread(target=lambda: flushed.append(session.flush()))
            flusher.start()
            flusher.join(30)
            assert flushed == [True]
            failed = events.of(SessionFailed)
            assert len(failed) == 1
            assert "connections in a row ended by errors" in str(failed[0])
            assert acks.with_status(AckStatus.UNKNOWN) == {guid}
            assert fake.connections == MAX_BAD_CONNECTIONS
        finally:
            session.close(timeout=5)

"""The driver's decisions, with no I/O: a ``DriverCore`` fed raw frames and a hand-moved clock."""

from __future__ import annotations

import logging

import pytest

from holdfast.proto import pb
from holdfast.sdk import SessionOptions
from holdfast.sdk.driver.core import MAX_BAD_CONNECTIONS, DriverCore
from holdfast.sdk.engine import SessionEngine
from holdfast.sdk.errors import RemoteProtocolError, TerminalTransportError
from holdfast.sdk.events import ConnectAttemptFailed, SessionEvent, SessionFailed
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.types import Message
from tests.support.columns import PushView, push_batch_of
from tests.support.fake_broker import HELLO_REPLY

URI = "hf://test/core"
GARBAGE = b"\xff\xff\xff"


class Rig:
    """A core, its engine and the events it emitted."""

    def __init__(self) -> None:
        self.events: list[SessionEvent] = []
        self.messages: list[Message] = []
        self.engine = SessionEngine(
            client_id="c", on_event=self.events.append, confirmer=lambda m, reject=None: None
        )
        self.core = DriverCore(
            self.engine, ["a:1", "b:2"], SessionOptions(connect_timeout=5.0), logging.getLogger()
        )
        self.now = 100.0

    def run_callbacks(self) -> None:
        for function, argument in self.engine.take_callbacks():
            function(argument)

    def connect(self) -> int:
        assert self.core.begin(self.now) is not None
        self.core.receive(self.core.generation, HELLO_REPLY, self.now)
        self.run_callbacks()
        return self.core.generation

    def bad_connection(self) -> float | None:
        generation = self.connect()
        with pytest.raises(RemoteProtocolError, match="does not parse"):
            self.core.receive(generation, GARBAGE, self.now)
        delay = self.core.ended(RemoteProtocolError("does not parse"))
        self.run_callbacks()
        return delay

    def open_reader(self) -> int:
        """Open a read queue on a fresh connection; its queue id."""
        generation = self.connect()
        record, _ = self.engine.open_queue(
            URI,
            read=True,
            write=False,
            options=QueueOptions(),
            on_message=self.messages.append,
            on_ack=None,
        )
        (open_frame,) = [
            item
            for item in self.engine.take_outbound()
            if isinstance(item, pb.ClientFrame) and item.HasField("open_queue")
        ]
        response = pb.Response(request_id=open_frame.open_queue.request_id, status=pb.STATUS_OK)
        self.core.receive(generation, pb.ServerFrame(response=response).SerializeToString(), 0)
        return record.queue_id


def push(queue_id: int) -> bytes:
    batch = push_batch_of([PushView(queue_id, bytes(16), b"")])
    return pb.ServerFrame(pushes=batch).SerializeToString()


def test_connections_ended_by_bad_frames_back_off_then_fail_the_session() -> None:
    rig = Rig()
    delays = [rig.bad_connection() for _ in range(MAX_BAD_CONNECTIONS)]
    assert all(d is not None and d >= 0 for d in delays[:-1])
    assert delays[-1] is None
    assert [e for e in rig.events if isinstance(e, SessionFailed)]
    assert rig.core.begin(rig.now) is None  # the session is over


def test_an_accepted_message_in_between_resets_the_count() -> None:
    rig = Rig()
    for _ in range(MAX_BAD_CONNECTIONS - 1):
        assert rig.bad_connection() is not None
    queue_id = rig.open_reader()
    rig.core.receive(rig.core.generation, push(queue_id), rig.now)
    rig.run_callbacks()
    assert len(rig.messages) == 1
    rig.core.ended(None)
    for _ in range(MAX_BAD_CONNECTIONS - 1):
        assert rig.bad_connection() is not None
    assert not [e for e in rig.events if isinstance(e, SessionFailed)]


def test_the_hello_deadline_ends_an_unanswered_connection_and_moves_on() -> None:
    rig = Rig()
    assert rig.core.begin(rig.now) == "a:1"
    assert rig.core.hello_remaining(rig.now + 1) == pytest.approx(4.0)
    rig.core.expire_hello()
    assert rig.core.ended(None) == 0.0  # the next address at once
    rig.run_callbacks()
    failed = [e for e in rig.events if isinstance(e, ConnectAttemptFailed)]
    assert failed == [ConnectAttemptFailed("a:1", "no answer to Hello within 5.0 s", 0.0)]
    assert rig.core.begin(rig.now) == "b:2"


def test_a_terminal_transport_error_fails_the_session_at_once() -> None:
    rig = Rig()
    rig.connect()
    assert rig.core.ended(TerminalTransportError("UNIMPLEMENTED: no such method")) is None
    rig.run_callbacks()
    assert [e for e in rig.events if isinstance(e, SessionFailed)]

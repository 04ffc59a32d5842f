"""The session driver over the in-memory transport: no sockets, no gRPC, no processes.

The threaded ``Session`` and the proxy's asyncio ``Upstream`` run the same driver
against a scripted broker on a ``MemoryNetwork``: the ordinary path, the Hello
deadline, and bad frames (one ends a connection; repeated ones fail the session).
"""

from __future__ import annotations

import asyncio

import pytest

from holdfast.proto import pb
from holdfast.proxy.upstream import Upstream
from holdfast.sdk import (
    AckStatus,
    ConnectAttemptFailed,
    QueueOptions,
    Reconnected,
    Session,
    SessionEvent,
    SessionFailed,
)
from holdfast.sdk.driver import MAX_BAD_CONNECTIONS
from holdfast.sdk.engine import WireAck
from holdfast.sdk.transports import AsyncMemoryTransport, MemoryNetwork, MemoryTransport
from tests.support.fake_broker import (
    BadFrame,
    Script,
    push_with_short_guid,
    push_with_stray_properties,
    serve_in_memory,
    unparseable,
)
from tests.support.recorder import AckRecorder, EventRecorder, MessageRecorder
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

ADDRESS = "broker.test:1"
URI = "hf://test/memory"


def network_with(script: Script) -> MemoryNetwork:
    network = MemoryNetwork()
    serve_in_memory(network, ADDRESS, script)
    return network


@pytest.mark.timeout(30)
def test_puts_are_acked_over_the_memory_transport() -> None:
    acks = AckRecorder()
    network = network_with(Script(unparseable, bad_connections=0))
    with Session(ADDRESS, options=FAST, transport=MemoryTransport(network)) as session:
        queue = session.open_queue(URI, write=True, on_ack=acks)
        guids = {queue.post(b"%d" % i) for i in range(1000)}
        assert session.flush(timeout=10)
    assert acks.with_status(AckStatus.SUCCESS) == guids


@pytest.mark.timeout(30)
def test_a_peer_that_never_answers_hello_is_dropped_at_the_deadline() -> None:
    events = EventRecorder()
    script = Script(unparseable, bad_connections=0)
    script.answer_hello = False
    network = network_with(script)
    with Session(
        ADDRESS, on_event=events, options=FAST, transport=MemoryTransport(network)
    ) as session:
        wait_until(lambda: events.of(ConnectAttemptFailed), timeout=10, what="a failed attempt")
        failed = events.of(ConnectAttemptFailed)[0]
        assert isinstance(failed, ConnectAttemptFailed)
        assert failed.reason == f"no answer to Hello within {FAST.connect_timeout} s"
        assert not session.connected


@pytest.mark.timeout(30)
def test_nothing_listening_is_a_failed_attempt_and_a_retry() -> None:
    events = EventRecorder()
    network = MemoryNetwork()
    with Session(ADDRESS, on_event=events, options=FAST, transport=MemoryTransport(network)):
        wait_until(lambda: len(events.of(ConnectAttemptFailed)) >= 2, timeout=10, what="retries")
        serve_in_memory(network, ADDRESS, Script(unparseable, bad_connections=0))
        wait_until(lambda: "Connected" in events.names(), timeout=10, what="a connection")


@pytest.mark.timeout(30)
def test_a_bad_frame_ends_one_memory_connection() -> None:
    events = EventRecorder()
    network = network_with(Script(push_with_short_guid, bad_connections=1))
    with Session(
        ADDRESS, on_event=events, options=FAST, transport=MemoryTransport(network)
    ) as session:
        session.open_queue(URI, read=True, on_message=MessageRecorder())
        wait_until(lambda: events.of(Reconnected), timeout=10, what="a reconnect")
        assert not events.of(SessionFailed)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "bad_frame", [push_with_short_guid, push_with_stray_properties, unparseable]
)
def test_the_proxy_upstream_outlives_repeated_bad_frames(bad_frame: BadFrame) -> None:
    """Past ``MAX_BAD_CONNECTIONS`` bad connections in a row the proxy's upstream keeps
    trying (an SDK session fails there), and works once the broker behaves."""

    async def scenario() -> None:
        script = Script(bad_frame, bad_connections=MAX_BAD_CONNECTIONS + 2)
        events: list[SessionEvent] = []
        outcomes: list[WireAck] = []
        upstream = Upstream(
            [ADDRESS],
            FAST,
            on_acks=outcomes.extend,
            on_event=events.append,
            transport=AsyncMemoryTransport(network_with(script)),
        )
        upstream.start()
        await upstream.open_queue(
            URI,
            read=True,
            write=False,
            options=QueueOptions(),
            on_message=MessageRecorder(),
            timeout=5,
        )
        writer = await upstream.open_queue(
            URI, read=False, write=True, options=QueueOptions(), on_message=None, timeout=20
        )
        async with asyncio.timeout(20):
            while script.connections <= MAX_BAD_CONNECTIONS + 2 or not upstream.engine.connected:
                await asyncio.sleep(0.01)
        guid = bytes(range(16))
        assert upstream.relay(writer.queue_id, b"x", None, guid)
        upstream.queued()
        async with asyncio.timeout(20):
            while not outcomes:
                await asyncio.sleep(0.01)
        assert outcomes == [(guid, pb.STATUS_OK)]
        assert not [e for e in events if isinstance(e, SessionFailed)]
        await upstream.stop()

    asyncio.run(scenario())

"""What a caller that died leaves in its reply queue: heartbeats and replies nobody will
read. Each carries the broker's pickup TTL (a heartbeat a few intervals, a reply its
call's deadline plus ``wire.REPLY_TTL_MARGIN``), so they expire and the queue empties;
they stayed for good before. The dead caller is played by requests posted by hand
whose reply queue nobody reads; both front-ends' workers (``flavour``)."""

from __future__ import annotations

import time
import uuid

import pytest

from holdfast.proto.validate import PICKUP_TTL
from holdfast.sdk import Message, Request, Session, WorkerOptions
from holdfast.sdk.errors import RpcTimeoutError
from holdfast.sdk.rpc import calls, wire
from tests.rpc.flavours import FLAVOURS, Flavour
from tests.rpc.test_stream_leftovers import left_in
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until

QUICK = WorkerOptions(heartbeat_interval=0.2, first_beat_after=0.05, caller_grace=1.0)


@pytest.fixture(params=sorted(FLAVOURS))
def flavour(request: pytest.FixtureRequest) -> Flavour:
    """The threaded or the asyncio worker."""
    return FLAVOURS[request.param]


def test_beats_and_requests_carry_what_lets_their_leftovers_expire() -> None:
    beat = wire.beat_properties(uuid.uuid4(), "hf://a/w", 0.5)
    assert beat[PICKUP_TTL] == str(wire.BEAT_TTL_BEATS * 500)
    assert wire.beat_properties(uuid.uuid4(), "hf://a/w", 0.01)[PICKUP_TTL] == "1000"
    call = calls.CallState(uuid.uuid4(), time.monotonic() + 30, time.monotonic() + 5)
    request = calls.request_properties(call, {}, "hf://a/reply", None)
    assert abs(int(request[wire.DEADLINE]) - (wire.wall_ms() + 30_000)) < 1000
    reply = wire.expiring_reply(wire.reply_properties(call.guid, {}), request)
    assert 39_000 < int(reply[PICKUP_TTL]) <= 40_000
    assert PICKUP_TTL not in wire.expiring_reply({}, {})  # an older caller's request
    late = wire.expiring_reply({}, {wire.DEADLINE: str(wire.wall_ms() - 60_000)})
    assert late[PICKUP_TTL] == "10000"
    assert wire.cancel_properties(uuid.uuid4())[PICKUP_TTL] == "60000"


def test_a_dead_caller_s_beats_and_replies_expire_from_its_reply_queue(
    broker: BrokerProcess, flavour: Flavour, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "REPLY_TTL_MARGIN", 0.5)
    # Named as the SDK names reply queues: a worker answers into no other.
    uri, reply_to = unique_uri("dead-caller"), f"hf://test/rpc-reply-{uuid.uuid4().hex}"
    runs: list[bytes] = []

    def handle(request: Request) -> bytes:
        runs.append(request.payload)
        if request.payload == b"slow":  # heartbeated until its caller is found gone
            request.cancelled.wait(10)
        return b"answer"

    with (
        flavour.worker(broker.address, uri, handle, QUICK),
        Session(broker.address, options=FAST) as session,
    ):
        service = session.open_queue(uri, write=True)
        now = wire.wall_ms()
        for payload in (b"fast", b"slow"):
            properties = wire.request_properties({}, reply_to, now + 5000, None, 5000)
            service.post(payload, properties | {wire.DEADLINE: str(now + 1000)})
        assert session.flush(10)
        wait_until(lambda: len(runs) == 2, 10, "both requests run")
        wait_until(lambda: left_in(broker.address, reply_to) >= 2, 10, "a reply and beats")
        wait_until(lambda: left_in(broker.address, reply_to) == 0, 15, "the leftovers expired")


def test_a_cancel_to_a_dead_worker_expires_from_its_control_queue(
    broker: BrokerProcess, flavour: Flavour, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller whose call times out cancels it at the worker its heartbeats named. A
    worker that died never reads its control queue again: the cancel carries the
    broker's pickup TTL (``wire.CANCEL_TTL``), so it expires; it stayed for good before.
    The dead worker is played by hand: it takes the request, beats once, and is gone."""
    monkeypatch.setattr(wire, "CANCEL_TTL", 0.5, raising=False)
    uri, control = unique_uri("dead-worker"), f"hf://test/rpc-worker-{uuid.uuid4().hex}"
    taken: list[Message] = []
    with (
        Session(broker.address, options=FAST) as session,
        flavour.caller(broker.address) as caller,
    ):
        session.open_queue(uri, read=True, on_message=taken.append)
        future = caller.request_async(uri, b"work", timeout=1.0)
        wait_until(lambda: len(taken) == 1, 10, "the request taken")
        request = taken[0]
        reply_to = request.properties[wire.REPLY_TO]
        beat = wire.beat_properties(request.guid, control, 0.2)
        session.open_queue(reply_to, write=True).post(b"", beat)
        request.confirm()
        with pytest.raises(RpcTimeoutError):
            future.result(10)
        wait_until(lambda: left_in(broker.address, control) == 1, 10, "the cancel sent")
        wait_until(lambda: left_in(broker.address, control) == 0, 10, "the cancel expired")

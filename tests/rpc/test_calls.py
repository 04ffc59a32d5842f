"""Request/reply against a real broker: replies, typed errors, pickup TTL, cancellation,
idempotent replies, and many concurrent calls across workers."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from holdfast.sdk import (
    Ack,
    AckStatus,
    DeadLetteredError,
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidQueueUriError,
    Message,
    RemoteHandlerError,
    Request,
    RequestRefusedError,
    RpcCancelledError,
    RpcError,
    RpcTimeoutError,
    Session,
    SessionClosedError,
    Worker,
    WorkerOptions,
)
from holdfast.sdk.poolnames import key_queue_uri
from holdfast.sdk.rpc import caller as caller_module
from holdfast.sdk.rpc import wire
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until

QUICK = WorkerOptions(heartbeat_interval=0.2, first_beat_after=0.05, caller_grace=1.0)


@pytest.fixture
def sessions(broker: BrokerProcess) -> Iterator[tuple[Session, Session]]:
    """A worker session and a caller session, both direct to the broker."""
    with (
        Session(broker.address, options=FAST) as worker,
        Session(broker.address, options=FAST) as caller,
    ):
        yield worker, caller


def test_reply_carries_payload_properties_and_request_guid(
    sessions: tuple[Session, Session],
) -> None:
    worker_session, caller = sessions
    uri = unique_uri("echo")
    seen: list[Request] = []

    def handle(request: Request) -> tuple[bytes, dict[str, str]]:
        seen.append(request)
        return request.payload.upper(), {"len": str(len(request.payload))}

    # A keyed request goes to the key's queue of the pool ``uri`` (holdfast.sdk.pool).
    with Worker(worker_session, key_queue_uri(uri, "tenant-7"), handle):
        reply = caller.request(uri, b"hello", properties={"a": "b"}, key="tenant-7", timeout=10)
    assert reply.payload == b"HELLO"
    assert reply.properties == {"len": "5"}
    assert reply.request_guid == seen[0].guid
    assert seen[0].properties == {"a": "b"}  # reserved x-rpc- properties are not shown
    assert seen[0].key == "tenant-7"


def test_handler_exception_is_a_typed_remote_error(sessions: tuple[Session, Session]) -> None:
    worker_session, caller = sessions
    uri = unique_uri("fails")

    def handle(request: Request) -> bytes:
        raise KeyError("no such account")

    with Worker(worker_session, uri, handle), pytest.raises(RemoteHandlerError) as caught:
        caller.request(uri, b"x", timeout=10)
    assert caught.value.error_type == "KeyError"
    assert "no such account" in caught.value.message
    assert isinstance(caught.value, RpcError)


def test_bad_arguments_are_refused_before_anything_is_sent(
    sessions: tuple[Session, Session],
) -> None:
    _, caller = sessions
    with pytest.raises(InvalidQueueUriError):
        caller.request("not-a-uri", b"", timeout=1)
    with pytest.raises(InvalidArgumentError):
        caller.request(unique_uri("x"), b"", timeout=1, pickup_timeout=2)
    with pytest.raises(InvalidPropertiesError):
        caller.request(unique_uri("x"), b"", properties={wire.REPLY_TO: "hf://a/b"}, timeout=1)


def test_pickup_timeout_is_a_typed_dead_letter_and_the_request_never_runs(
    sessions: tuple[Session, Session],
) -> None:
    worker_session, caller = sessions
    uri = unique_uri("nobody")
    started = time.monotonic()
    with pytest.raises(DeadLetteredError) as caught:
        caller.request(uri, b"late", timeout=10, pickup_timeout=0.5)
    assert caught.value.reason == "expired"
    assert 0.3 < time.monotonic() - started < 5
    assert "broker dead-lettered" in str(caught.value)  # the broker's notice, not the timer
    # A worker arriving afterwards finds the expired request and does not run it.
    runs: list[bytes] = []

    def handle(request: Request) -> bytes:
        runs.append(request.payload)
        return b"ok"

    with Worker(worker_session, uri, handle):
        assert caller.request(uri, b"fresh", timeout=10).payload == b"ok"
    assert runs == [b"fresh"]


def test_worker_answers_an_expired_request_with_a_dead_letter_reply(
    sessions: tuple[Session, Session],
) -> None:
    """The worker's own check (the caller may be on a host whose deadline is later): a
    request first delivered after its ``x-rpc-expires`` is not run; the reply queue gets
    an error reply with dead-letter reason ``expired`` under the derived reply GUID."""
    worker_session, client = sessions
    # A reply queue named as the SDK names them: a worker answers into no other.
    uri, reply_to = unique_uri("stale"), f"hf://test/rpc-reply-{uuid.uuid4().hex}"
    replies: list[Message] = []
    client.open_queue(reply_to, read=True, on_message=replies.append)
    request_guid = client.open_queue(uri, write=True).post(
        b"expired", wire.request_properties({}, reply_to, wire.wall_ms() - 1000, None)
    )
    runs: list[bytes] = []

    def handle(request: Request) -> bytes:
        runs.append(request.payload)
        return b""

    with Worker(worker_session, uri, handle):
        wait_until(lambda: replies, 10, "the dead-letter reply")
    (reply,) = replies
    assert reply.guid == wire.reply_guid(request_guid)
    assert reply.properties[wire.KIND] == wire.FAILURE
    assert reply.properties[wire.ERROR] == wire.DEAD_LETTER
    assert reply.properties[wire.DEATH_REASON] == "expired"
    assert reply.properties[wire.REQUEST] == request_guid.hex
    assert runs == []


def test_timeout_cancels_the_running_handler(sessions: tuple[Session, Session]) -> None:
    worker_session, caller = sessions
    uri = unique_uri("slow")
    cancelled = threading.Event()

    def handle(request: Request) -> bytes:
        if request.cancelled.wait(20):
            cancelled.set()
        return b"too late"

    with Worker(worker_session, uri, handle, options=QUICK):
        with pytest.raises(RpcTimeoutError):
            caller.request(uri, b"", timeout=1.0)
        wait_until(cancelled.is_set, 10, "the handler to see the cancel")


def test_cancel_reaches_a_worker_that_already_collected_the_request(
    sessions: tuple[Session, Session],
) -> None:
    worker_session, caller = sessions
    uri = unique_uri("cancel")
    started = threading.Event()
    cancelled = threading.Event()

    def handle(request: Request) -> bytes:
        started.set()
        if request.cancelled.wait(20):
            cancelled.set()
        return b""

    with Worker(worker_session, uri, handle, options=QUICK) as worker:
        future = caller.request_async(uri, b"", timeout=30)
        assert started.wait(10)
        assert future.cancel()
        wait_until(cancelled.is_set, 10, "the handler to see the cancel")
        assert worker.handler_runs == 1


def test_cancel_before_pickup_reaches_the_worker_at_its_first_heartbeat(
    sessions: tuple[Session, Session],
) -> None:
    worker_session, caller = sessions
    uri = unique_uri("early-cancel")
    cancelled = threading.Event()

    def handle(request: Request) -> bytes:
        if request.cancelled.wait(20):
            cancelled.set()
        return b""

    future = caller.request_async(uri, b"", timeout=30)
    assert future.cancel()
    with Worker(worker_session, uri, handle, options=QUICK):
        wait_until(cancelled.is_set, 10, "the handler to see the cancel")


def test_closing_the_caller_cancels_its_calls(broker: BrokerProcess) -> None:
    uri = unique_uri("close")
    started = threading.Event()
    cancelled = threading.Event()

    def handle(request: Request) -> bytes:
        started.set()
        if request.cancelled.wait(20):
            cancelled.set()
        return b""

    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, handle, options=QUICK),
    ):
        caller = Session(broker.address, options=FAST)
        future = caller.request_async(uri, b"", timeout=30)
        assert started.wait(10)
        wait_until(
            lambda: caller._rpc()._calls and next(iter(caller._rpc()._calls.values())).worker, 10
        )
        caller.close()
        with pytest.raises(RpcCancelledError):
            future.result(1)
        wait_until(cancelled.is_set, 10, "the handler to see the cancel")


def test_thousand_concurrent_calls_across_four_workers_answered_once_each(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("many")
    runs: Counter[bytes] = Counter()
    lock = threading.Lock()

    def handle(request: Request) -> bytes:
        with lock:
            runs[request.payload] += 1
        return b"re:" + request.payload

    worker_sessions = [Session(broker.address, options=FAST) for _ in range(4)]
    workers = [Worker(s, uri, handle, concurrency=4) for s in worker_sessions]
    try:
        with Session(broker.address, options=FAST) as caller:
            futures = [caller.request_async(uri, b"%d" % i, timeout=60) for i in range(1000)]
            replies = [f.result(90) for f in futures]
    finally:
        for worker in workers:
            worker.close()
        for session in worker_sessions:
            session.close()
    assert [r.payload for r in replies] == [b"re:%d" % i for i in range(1000)]
    assert len({r.request_guid for r in replies}) == 1000
    assert sum(runs.values()) == 1000 and set(runs.values()) == {1}
    assert all(w.handler_runs > 0 for w in workers), [w.handler_runs for w in workers]


def test_a_malformed_request_is_dropped_without_harming_the_worker(
    sessions: tuple[Session, Session],
) -> None:
    worker_session, caller = sessions
    uri = unique_uri("garbage")
    queue = caller.open_queue(uri, write=True)
    queue.post(b"no reply-to")
    queue.post(b"bad reply-to", {wire.REPLY_TO: "nowhere"})
    runs: list[bytes] = []

    def handle(request: Request) -> bytes:
        runs.append(request.payload)
        return b"fine"

    with Worker(worker_session, uri, handle):
        assert caller.request(uri, b"good", timeout=10).payload == b"fine"
    assert runs == [b"good"]


def test_the_future_serves_an_asyncio_front_end(sessions: tuple[Session, Session]) -> None:
    """``await asyncio.wrap_future(session.request_async(...))``: what ``holdfast.sdk.aio``
    wraps."""
    worker_session, caller = sessions
    uri = unique_uri("aio")

    async def call() -> bytes:
        futures = [asyncio.wrap_future(caller.request_async(uri, b"%d" % i)) for i in range(20)]
        return b"".join(reply.payload for reply in await asyncio.gather(*futures))

    with Worker(worker_session, uri, lambda r: r.payload, concurrency=2):
        assert asyncio.run(call()) == b"".join(b"%d" % i for i in range(20))


def test_a_blocking_request_from_a_callback_is_refused_not_deadlocked(
    sessions: tuple[Session, Session],
) -> None:
    _, caller = sessions
    uri = unique_uri("inside")
    outcome: list[BaseException] = []

    def on_message(message: Message) -> None:
        try:
            caller.request(unique_uri("any"), b"", timeout=30)
        except RpcError as error:
            outcome.append(error)
        message.confirm()

    caller.open_queue(uri, read=True, write=True, on_message=on_message).post(b"go")
    wait_until(lambda: outcome, 10, "the refusal")
    assert "request_async" in str(outcome[0])


def test_a_request_the_broker_refuses_fails_typed(sessions: tuple[Session, Session]) -> None:
    """An ACK other than SUCCESS/UNKNOWN (e.g. the broker's store failed) ends the call."""
    _, caller = sessions
    rpc = caller._rpc()
    future = caller.request_async(unique_uri("refused"), b"", timeout=30)
    (call,) = rpc._calls.values()
    rpc._on_request_ack(call, Ack(call.guid, AckStatus.STORE_ERROR, "hf://test/refused"))
    with pytest.raises(RequestRefusedError) as caught:
        future.result(5)
    assert caught.value.status == "STORE_ERROR"


def test_closing_a_worker_hands_an_unfinished_request_to_another(
    broker: BrokerProcess, sessions: tuple[Session, Session]
) -> None:
    worker_session, caller = sessions
    uri = unique_uri("handover")
    started, release = threading.Event(), threading.Event()

    def stuck(request: Request) -> bytes:
        started.set()
        release.wait(30)  # ignores its cancel
        return b"first"

    first = Worker(worker_session, uri, stuck)
    try:
        future = caller.request_async(uri, b"", timeout=30)
        assert started.wait(10)
        began = time.monotonic()
        first.close(timeout=0.5)
        assert time.monotonic() - began < 10  # not held by the stuck handler
        with (
            Session(broker.address, options=FAST) as other,
            Worker(other, uri, lambda r: b"second"),
        ):
            assert future.result(20).payload == b"second"
    finally:
        release.set()


def test_a_request_cancelled_while_it_waits_for_a_thread_never_runs(
    sessions: tuple[Session, Session],
) -> None:
    worker_session, caller = sessions
    uri = unique_uri("queued")
    release = threading.Event()
    ran: list[bytes] = []

    def handle(request: Request) -> bytes:
        ran.append(request.payload)
        release.wait(30)
        return request.payload

    options = WorkerOptions(heartbeat_interval=0.2, first_beat_after=0.05, extra_requests=1)
    with Worker(worker_session, uri, handle, concurrency=1, options=options) as worker:
        running = caller.request_async(uri, b"running", timeout=30)
        wait_until(lambda: ran == [b"running"], 10, "the first call to run")
        waiting = caller.request_async(uri, b"waiting", timeout=30)
        calls = caller._rpc()._calls
        wait_until(lambda: all(c.worker for c in calls.values()), 10, "both calls heartbeated")
        assert waiting.cancel()
        jobs = worker._running
        wait_until(
            lambda: any(j.request.cancelled.is_set() for j in list(jobs.values())),
            10,
            "the waiting request to be marked cancelled",
        )
        release.set()
        assert running.result(10).payload == b"running"
        wait_until(lambda: not worker._running, 10, "the cancelled request to be settled")
    assert ran == [b"running"]


def test_a_request_on_a_closed_session_is_refused(broker: BrokerProcess) -> None:
    session = Session(broker.address, options=FAST)
    session.close()
    with pytest.raises(SessionClosedError):
        session.request(unique_uri("x"), b"", timeout=1)


def test_control_queue_handles_for_cancels_stay_bounded(
    broker: BrokerProcess, sessions: tuple[Session, Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(caller_module, "MAX_WORKER_HANDLES", 1)
    _, caller = sessions
    cancelled: list[bytes] = []

    def handle(request: Request) -> bytes:
        if request.cancelled.wait(20):
            cancelled.append(request.payload)
        return b""

    for name in (b"one", b"two"):
        uri = unique_uri(name.decode())
        with (
            Session(broker.address, options=FAST) as session,
            Worker(session, uri, handle, options=QUICK),
        ):
            future = caller.request_async(uri, name, timeout=30)
            calls = caller._rpc()._calls
            wait_until(lambda: all(c.worker for c in calls.values()), 10, "a beat")  # noqa: B023
            future.cancel()
            wait_until(lambda: name in cancelled, 10, "the cancel")  # noqa: B023
    assert cancelled == [b"one", b"two"]
    assert len(caller._rpc()._workers) == 1

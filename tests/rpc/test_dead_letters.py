"""Request/reply meets the dead-letter rules (issues #14, #15): requests that keep
crashing workers end at the service queue's delivery limit, requests nobody picks up
expire at the broker, and in both cases the caller gets a typed error naming the
reason while the request lands in the dead-letter queue. Plus ``await
session.request`` on the asyncio session."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import DeadLetteredError, Request, RpcTimeoutError, Session, Worker, aio
from holdfast.sdk.admin import AdminClient
from tests.policies.support import Collector
from tests.rpc.support import wait_for_starts, worker_process
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri

pytestmark = pytest.mark.timeout(90)


def test_a_request_that_keeps_crashing_workers_is_dead_lettered_and_the_caller_told(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    uri, log = unique_uri("crashy"), tmp_path / "runs.log"
    dlq = uri + ".dlq"
    with AdminClient(broker.address) as admin:
        admin.set_policy(uri, QueuePolicy(max_deliveries=2, dead_letter=dlq))
    dead = Collector()
    with Session(broker.address, options=FAST) as caller:
        future = caller.request_async(uri, b"poison", timeout=60)
        for runs in (1, 2):
            with worker_process(broker.address, uri, log, sleep=60) as worker:
                wait_for_starts(log, runs)
                worker.kill()  # kill -9 mid-call, twice: the limit is 2 deliveries
        with pytest.raises(DeadLetteredError) as caught:
            future.result(30)
        caller.open_queue(dlq, read=True, on_message=dead)
        (letter,) = dead.wait_for(1)
    assert caught.value.reason == "delivery-limit"
    assert "after 2 deliveries" in str(caught.value)
    assert letter.payload == b"poison"
    assert letter.properties["x-death-reason"] == "delivery-limit"
    assert "x-ttl-ms" not in letter.properties  # a dead letter does not expire again


def test_a_request_nobody_picks_up_expires_at_the_broker(broker: BrokerProcess) -> None:
    uri = unique_uri("unpicked")
    dlq = uri + ".dlq"
    with AdminClient(broker.address) as admin:
        admin.set_policy(uri, QueuePolicy(dead_letter=dlq))
        with Session(broker.address, options=FAST) as caller:
            started = time.monotonic()
            with pytest.raises(DeadLetteredError, match="broker dead-lettered") as caught:
                caller.request(uri, b"late", timeout=30, pickup_timeout=1.0)
            elapsed = time.monotonic() - started
            assert caught.value.reason == "expired"
            assert 0.5 < elapsed < 1.0  # the broker's notice, before the caller's own timer
            assert admin.stats(uri).ready == 0
            (letter,) = admin.peek(dlq)
    assert letter.properties["x-death-reason"] == "expired"
    assert letter.properties["x-original-uri"] == uri


def test_a_request_the_full_service_queue_never_took_is_a_timeout_not_a_dead_letter(
    broker: BrokerProcess,
) -> None:
    """The broker pushed the request back (QUEUE_FULL) until its pickup deadline: it
    was never enqueued, so nothing was dead-lettered, and the caller says so (it said
    ``DeadLetteredError('expired')``), on the threaded and the asyncio caller."""
    uri = unique_uri("full")
    with AdminClient(broker.address) as admin:
        admin.set_policy(uri, QueuePolicy(max_messages=1))
        with Session(broker.address, options=FAST) as caller:
            caller.open_queue(uri, write=True).post(b"filler")
            assert caller.flush(10)
            with pytest.raises(RpcTimeoutError, match="not taken by the broker"):
                caller.request(uri, b"late", timeout=5, pickup_timeout=1.0)

        async def aio_call() -> None:
            async with aio.Session(broker.address, options=FAST) as session:
                with pytest.raises(RpcTimeoutError, match="not taken by the broker"):
                    await session.request(uri, b"late", timeout=5, pickup_timeout=1.0)

        asyncio.run(aio_call())
        assert admin.stats(uri).dead_lettered == 0


def test_await_request_on_the_asyncio_session(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-echo")

    def handle(request: Request) -> bytes:
        return b"echo:" + request.payload

    async def calls() -> None:
        async with aio.Session(broker.address, options=FAST) as session:
            replies = await asyncio.gather(
                *(session.request(uri, b"%d" % i, timeout=20) for i in range(20))
            )
            assert [r.payload for r in replies] == [b"echo:%d" % i for i in range(20)]
            with pytest.raises(DeadLetteredError):
                await session.request(unique_uri("nobody"), b"", timeout=5, pickup_timeout=0.5)
            with pytest.raises(RpcTimeoutError):
                await session.request(uri, b"slow", timeout=1.5, pickup_timeout=1.0)

    slow = {b"slow"}

    def maybe_slow(request: Request) -> bytes:
        if request.payload in slow:
            request.cancelled.wait(5)
        return handle(request)

    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, maybe_slow, concurrency=4),
    ):
        asyncio.run(calls())

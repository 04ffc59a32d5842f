"""The asyncio caller and worker on one event loop (no thread of the SDK's own):
replies, typed errors, cancellation of the awaiting task reaching the handler's task,
idempotent replies, and many calls in flight."""

from __future__ import annotations

import asyncio
import threading

import pytest

from holdfast.sdk import RemoteHandlerError, Request, RpcTimeoutError, WorkerOptions, aio
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri

QUICK = WorkerOptions(heartbeat_interval=0.2, first_beat_after=0.05, caller_grace=1.0)


def test_calls_handler_errors_and_properties(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-worker")

    async def handle(request: Request) -> tuple[bytes, dict[str, str]]:
        if request.payload == b"boom":
            raise KeyError("no such thing")
        return b"echo:" + request.payload, {"seen": request.properties.get("p", "")}

    async def run() -> None:
        async with (
            aio.Session(broker.address, options=FAST) as session,
            aio.Worker(session, uri, handle, concurrency=8) as worker,
        ):
            replies = await asyncio.gather(
                *(session.request(uri, b"%d" % i, properties={"p": str(i)}) for i in range(200))
            )
            assert [r.payload for r in replies] == [b"echo:%d" % i for i in range(200)]
            assert [r.properties["seen"] for r in replies] == [str(i) for i in range(200)]
            with pytest.raises(RemoteHandlerError) as raised:
                await session.request(uri, b"boom", timeout=10)
            assert raised.value.error_type == "KeyError"
            assert worker.handler_runs == 201

    asyncio.run(run())


def test_cancelling_the_awaiting_task_cancels_the_handlers_task(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-cancel")

    async def run() -> None:
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def handle(request: Request) -> bytes:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                assert request.cancelled.is_set()
                cancelled.set()
                raise
            return b""

        async with (
            aio.Session(broker.address, options=FAST) as session,
            aio.Worker(session, uri, handle, options=QUICK),
        ):
            call = asyncio.create_task(session.request(uri, b"x", timeout=60))
            await asyncio.wait_for(started.wait(), 20)
            await asyncio.sleep(0.3)  # the first heartbeat names the worker
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.wait_for(cancelled.wait(), 20)

    asyncio.run(run())


def test_timeout_is_typed_and_tells_the_worker(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-timeout")
    stopped = threading.Event()

    def handle(request: Request) -> bytes:  # a plain function: run in the executor
        if request.cancelled.wait(30):
            stopped.set()
        return b""

    async def run() -> None:
        async with (
            aio.Session(broker.address, options=FAST) as session,
            aio.Worker(session, uri, handle, options=QUICK),
        ):
            with pytest.raises(RpcTimeoutError):
                await session.request(uri, b"x", timeout=1.0)
            await asyncio.wait_for(asyncio.to_thread(stopped.wait, 20), 25)
            assert stopped.is_set()

    asyncio.run(run())

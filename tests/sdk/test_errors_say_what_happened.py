"""Errors that say what happened (the first hour): each message names its cause."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import uuid

import pytest

from holdfast.proto import PROTOCOL_VERSION
from holdfast.sdk import (
    InvalidArgumentError,
    Message,
    QueueNotOpenError,
    RequestTimeoutError,
    Session,
)
from holdfast.sdk import aio as hf_aio
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from holdfast.sdk.testing import Broker
from holdfast.sdk.transports import AsyncMemoryTransport, MemoryNetwork, MemoryTransport
from tests.support.waiting import wait_until

FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.05))

pytestmark = pytest.mark.timeout(60)


def test_an_open_that_never_connected_says_so_and_why(free_port: int) -> None:
    address = f"127.0.0.1:{free_port}"  # nothing listens there
    with (
        Session(address, options=FAST) as session,
        pytest.raises(RequestTimeoutError) as timed_out,
    ):
        session.open_queue("hf://d/q", write=True, timeout=1.5)
    message = str(timed_out.value)
    assert message.startswith("opening hf://d/q did not complete within 1.5 s: never connected")
    assert address in message
    assert "attempts" in message
    assert isinstance(timed_out.value, TimeoutError)


def test_the_same_in_memory_says_what_the_attempts_saw() -> None:
    network = MemoryNetwork()  # no broker listens on it
    with (
        Session("nowhere:7700", options=FAST, transport=MemoryTransport(network)) as session,
        pytest.raises(RequestTimeoutError, match=r"never connected to nowhere:7700 \("),
    ):
        session.open_queue("hf://d/q", write=True, timeout=0.5)


@pytest.mark.parametrize(
    ("address", "cause"),
    [
        ("http://127.0.0.1:7701", "URL scheme"),
        ("127.0.0.1", "no port"),
        ("127.0.0.1:99999", "from 1 to 65535"),
        ("127.0.0.1:0", "from 1 to 65535"),
        ("127.0.0.1:port", "from 1 to 65535"),
        (" , ", "no address"),
        ("my host:7701", "no valid host"),
    ],
)
def test_bad_addresses_are_refused_at_once_naming_the_address(address: str, cause: str) -> None:
    with pytest.raises(InvalidArgumentError, match=cause):
        Session(address)


def test_a_long_bad_address_is_quoted_only_in_part() -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        Session("x" * 5000)
    assert len(str(refused.value)) < 300


def test_post_with_a_guid_that_is_not_a_uuid_is_a_typed_error() -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as session:
        queue = session.open_queue("hf://d/q", write=True)
        with pytest.raises(InvalidArgumentError, match=r"uuid\.UUID, not str"):
            queue.post(b"x", guid="abc")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="payload must be bytes, not str"):
            queue.post("text")  # type: ignore[arg-type]
        assert session.pending_count == 0  # nothing was taken


def test_a_callback_that_is_not_callable_is_refused_where_it_is_given() -> None:
    with pytest.raises(InvalidArgumentError, match="on_event must be callable, not int"):
        Session("127.0.0.1:1", on_event=5)  # type: ignore[arg-type]
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as session:
        with pytest.raises(InvalidArgumentError, match="on_message must be callable, not str"):
            session.open_queue("hf://d/q", read=True, on_message="print")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="on_ack must be callable, not int"):
            session.open_queue("hf://d/q", write=True, on_ack=5)  # type: ignore[arg-type]
        queue = session.open_queue("hf://d/q", write=True)
        with pytest.raises(InvalidArgumentError, match="on_ack must be callable, not int"):
            queue.post(b"x", on_ack=5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="on_ack must be callable, not int"):
            queue.post_many([b"x"], on_ack=5)  # type: ignore[arg-type]
        assert session.pending_count == 0  # nothing was taken

    async def main() -> None:
        with pytest.raises(InvalidArgumentError, match="on_event must be callable"):
            hf_aio.Session("127.0.0.1:1", on_event=5)  # type: ignore[arg-type]
        with Broker() as broker:
            async with hf_aio.Session(broker.address, transport=broker.async_transport()) as s:
                with pytest.raises(InvalidArgumentError, match="on_message must be callable"):
                    await s.open_queue("hf://d/q", read=True, on_message=1)  # type: ignore[arg-type]
                queue = await s.open_queue("hf://d/q", write=True)
                with pytest.raises(InvalidArgumentError, match="on_ack must be callable"):
                    await queue.post(b"x", on_ack=5)  # type: ignore[arg-type]
                with pytest.raises(InvalidArgumentError, match="on_ack must be callable"):
                    await queue.post_many([b"x"], on_ack=5)  # type: ignore[arg-type]

    asyncio.run(main())


async def _async_handler(message: object) -> None:
    raise AssertionError("never awaited")


class _AsyncCallable:
    async def __call__(self, message: object) -> None:
        raise AssertionError("never awaited")


@pytest.mark.parametrize("handler", [_async_handler, _AsyncCallable()], ids=["def", "call"])
def test_an_async_callback_is_refused_where_it_is_given(handler: object) -> None:
    """An ``async def`` on_message was taken, called, its coroutine dropped (a "never
    awaited" warning at most): the message was never confirmed and the consumer
    stalled at its window. Callbacks are never awaited, so it is refused."""
    with pytest.raises(InvalidArgumentError, match="on_event is an async function"):
        Session("127.0.0.1:1", on_event=handler)  # type: ignore[arg-type]
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as session:
        with pytest.raises(InvalidArgumentError, match="on_message is an async function"):
            session.open_queue("hf://d/q", read=True, on_message=handler)  # type: ignore[arg-type]
        queue = session.open_queue("hf://d/q", write=True)
        with pytest.raises(InvalidArgumentError, match="on_ack is an async function"):
            queue.post(b"x", on_ack=handler)  # type: ignore[arg-type]
        assert session.pending_count == 0

    async def main() -> None:
        with pytest.raises(InvalidArgumentError, match="on_event is an async function"):
            hf_aio.Session("127.0.0.1:1", on_event=handler)  # type: ignore[arg-type]
        with Broker() as broker:
            async with hf_aio.Session(broker.address, transport=broker.async_transport()) as s:
                with pytest.raises(InvalidArgumentError, match="async for"):
                    await s.open_queue("hf://d/q", read=True, on_message=handler)  # type: ignore[arg-type]
                queue = await s.open_queue("hf://d/q", write=True)
                with pytest.raises(InvalidArgumentError, match="on_ack is an async function"):
                    await queue.post(b"x", on_ack=handler)  # type: ignore[arg-type]

    asyncio.run(main())


def test_an_on_message_that_returns_a_coroutine_has_its_message_redelivered() -> None:
    """A plain function handing back a coroutine did not handle the message: it is
    rejected with requeue like one that raised, and comes back, never left held."""
    started: list[Message] = []

    async def later(message: Message) -> None:
        raise AssertionError("never awaited")

    def handler(message: Message) -> object:
        started.append(message)
        return later(message)

    with Broker() as broker, Session(broker.address, transport=broker.transport()) as session:
        uri = f"hf://d/coro-{uuid.uuid4().hex[:6]}"
        session.open_queue(uri, write=True).post(b"x")
        session.open_queue(uri, read=True, on_message=handler)
        wait_until(lambda: len(started) >= 2, 10, "the redelivery")
    assert [m.delivery_count for m in started[:2]] == [1, 2]


@pytest.mark.parametrize("delay", [-1.0, float("nan"), float("inf"), 1e17, 3600.5])
def test_a_reject_delay_outside_an_hour_is_refused_and_the_message_kept(delay: float) -> None:
    """``reject(delay=1e17)`` passed and killed the asyncio session's writer (and
    looped the threaded one's connection): the delay must fit the broker's hour."""
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as session:
        uri = f"hf://d/reject-{uuid.uuid4().hex[:6]}"
        session.open_queue(uri, write=True).post(b"x")
        received: list[Message] = []
        session.open_queue(uri, read=True, on_message=received.append)
        wait_until(lambda: len(received) == 1, 10, "the delivery")
        with pytest.raises(InvalidArgumentError, match=r"delay must be in \[0, 3600\] seconds"):
            received[0].reject(delay=delay)
        assert not received[0].settled
        received[0].reject(delay=3600)  # the longest is fine
        assert received[0].settled


def test_a_second_settle_is_refused_locally_and_sends_nothing() -> None:
    """reject() then confirm() (or confirm() twice) went to the broker, which refused
    it; at 100 a second the session was ended and the rejected messages came back."""
    from holdfast.sdk import AlreadySettledError, ConfirmRejected, SessionEvent

    events: list[SessionEvent] = []
    with (
        Broker() as broker,
        Session(broker.address, transport=broker.transport(), on_event=events.append) as s,
    ):
        uri = f"hf://d/settle-{uuid.uuid4().hex[:6]}"
        producer = s.open_queue(uri, write=True)
        for i in range(300):
            producer.post(b"%d" % i)
        received: list[Message] = []
        s.open_queue(uri, read=True, on_message=received.append)
        wait_until(lambda: len(received) == 300, 10, "the deliveries")
        for n, message in enumerate(received):
            if n % 2:
                message.reject(requeue=False)
            else:
                message.confirm()
            with pytest.raises(AlreadySettledError, match="confirmed or rejected already"):
                message.confirm()
            with pytest.raises(AlreadySettledError):
                message.reject()
        assert s.flush(timeout=10)
    assert not [e for e in events if isinstance(e, ConfirmRejected)]
    assert [type(e).__name__ for e in events].count("ConnectionLost") == 0

    async def main() -> None:
        with Broker() as broker:
            async with hf_aio.Session(broker.address, transport=broker.async_transport()) as a:
                uri = "hf://d/settle-aio"
                await (await a.open_queue(uri, write=True)).post(b"x")
                queue = await a.open_queue(uri, read=True)
                async for message in queue:
                    message.confirm()
                    with pytest.raises(AlreadySettledError):
                        message.reject(requeue=False)
                    break

    asyncio.run(main())


def test_a_closed_queue_is_named_by_its_uri() -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as session:
        queue = session.open_queue("hf://d/closed-one", write=True)
        queue.close()
        with pytest.raises(QueueNotOpenError, match="queue hf://d/closed-one is closed"):
            queue.post(b"late")
        queue.close()  # closed already: nothing happens, as for a second Session.close()


def test_the_asyncio_api_names_a_closed_queue_and_a_never_connected_open() -> None:
    async def main() -> None:
        network = MemoryNetwork()
        async with hf_aio.Session(
            "nowhere:7700", options=FAST, transport=AsyncMemoryTransport(network)
        ) as session:
            with pytest.raises(RequestTimeoutError, match="never connected to nowhere:7700"):
                await session.open_queue("hf://d/q", write=True, timeout=0.5)
        with Broker() as broker:
            async with hf_aio.Session(broker.address, transport=broker.async_transport()) as s:
                queue = await s.open_queue(f"hf://d/aio-{uuid.uuid4().hex[:6]}", write=True)
                await queue.close()
                with pytest.raises(
                    QueueNotOpenError, match=re.escape(f"queue {queue.uri} is closed")
                ):
                    await queue.post(b"late")

    asyncio.run(main())


@pytest.mark.parametrize("program", ["holdfast-broker", "holdfast-proxy"])
def test_servers_print_their_version(program: str) -> None:
    module = "holdfast.broker.cli" if program == "holdfast-broker" else "holdfast.proxy.cli"
    done = subprocess.run(
        [sys.executable, "-c", f"import {module} as m; m.main(['--version'])"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0
    assert done.stdout.startswith(f"{program} ") and f"(protocol {PROTOCOL_VERSION})" in done.stdout


CTRL_C = """
import os, signal, sys, threading, time
from holdfast.sdk import Session
from holdfast.sdk.testing import Broker

def waiting_in(caller):
    # Whether the main thread waits in Session.flush() called from `caller`.
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "flush" and code.co_filename.endswith("session.py"):
            return frame.f_back is not None and frame.f_back.f_code.co_name == caller
        frame = frame.f_back
    return False

def ctrl_c_twice():
    # Each Ctrl-C once the main thread waits where it is meant to land (a timer would
    # land elsewhere on a busy machine): flush(), then the flush inside close().
    for caller in ("<module>", "close"):
        deadline = time.monotonic() + 30
        while not waiting_in(caller) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

acks = []
with Broker() as broker:
    started = time.monotonic()
    try:
        with Session(broker.address, transport=broker.transport()) as session:
            queue = session.open_queue("hf://d/ctrl-c", write=True, on_ack=acks.append)
            broker.delay(60)  # no ACK comes back: every PUT stays pending
            for i in range(100):
                queue.post(b"m")
            threading.Thread(target=ctrl_c_twice, daemon=True).start()
            session.flush(timeout=30)  # Ctrl-C here, and again in close()
    except KeyboardInterrupt:
        print("interrupted")
    print("seconds", round(time.monotonic() - started, 1))
    print("acks", len(acks), sorted({a.status.value for a in acks}))
    broker.delay(0)
"""


def test_ctrl_c_twice_stops_quickly_and_still_reports_every_put() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C], capture_output=True, text=True, timeout=60
    )
    assert "interrupted" in done.stdout, done.stdout + done.stderr
    assert "acks 100 ['UNKNOWN']" in done.stdout, done.stdout + done.stderr
    seconds = float(done.stdout.split("seconds ")[1].split()[0])
    assert seconds < 10  # not the 30 s close timeout


@pytest.mark.parametrize("timeout", [1e12, float("inf")])
def test_a_timeout_past_what_a_lock_can_time_means_as_long_as_it_takes(timeout: float) -> None:
    """``open_queue(timeout=1e10)`` and ``flush(timeout=inf)`` raised OverflowError
    (``threading.TIMEOUT_MAX``); the asyncio session took them already."""
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as session:
        queue = session.open_queue("hf://d/long-wait", write=True, timeout=timeout)
        queue.post(b"x")
        assert session.flush(timeout=timeout)
        received: list[Message] = []
        session.open_queue("hf://d/long-wait", read=True, on_message=received.append)
        wait_until(lambda: len(received) == 1, 10, "the delivery")

    async def main() -> None:
        with Broker() as broker:
            async with hf_aio.Session(broker.address, transport=broker.async_transport()) as s:
                aio_queue = await s.open_queue("hf://d/long-wait", write=True, timeout=timeout)
                await aio_queue.post(b"y")
                assert await s.flush(timeout=timeout)

    asyncio.run(main())

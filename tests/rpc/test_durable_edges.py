"""The edges of request/reply's arguments and timeouts: a call's ``timeout`` holds also
while the broker is unreachable (its queue opens within it), ``fetch_reply`` with
``timeout=0`` takes a reply the broker holds, arguments of the wrong type get
``InvalidArgumentError``, not a ``TypeError``, and a reply fetched again has streams
that fail at once with ``StreamTakenError`` (the first fetch took them), not after
the 30 s stall timeout. A timeout over ``calls.MAX_TIMEOUT`` (ten years) is an
``InvalidArgumentError`` naming the argument and the bound, on both front-ends."""

from __future__ import annotations

import asyncio
import io
import time
import uuid

import pytest

from holdfast.sdk import (
    InvalidArgumentError,
    Request,
    RpcTimeoutError,
    Session,
    StreamingReply,
    StreamTakenError,
    Worker,
    aio,
)
from holdfast.sdk.rpc import calls, durable, wire
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.toxics import free_port


def some_id(session_token: str | None = None) -> str:
    """A well-formed request id of the default token, kept for an hour."""
    rid = durable.RequestId("test", uuid.uuid4(), wire.wall_ms() + 3_600_000)
    return rid.text(session_token)


def test_calls_keep_their_timeout_while_the_broker_is_unreachable() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    with Session(nobody, options=FAST) as session:
        for name, call in (
            ("fetch_reply", lambda: session.fetch_reply(some_id(), timeout=1.0)),
            ("request_durable", lambda: session.request_durable(unique_uri("x"), b"", timeout=1.0)),
            ("request", lambda: session.request(unique_uri("x"), b"", timeout=1.0)),
        ):
            started = time.monotonic()
            with pytest.raises(RpcTimeoutError):
                call()
            assert time.monotonic() - started < 5, name


def test_asyncio_calls_keep_their_timeout_while_the_broker_is_unreachable() -> None:
    nobody = f"127.0.0.1:{free_port()}"

    async def run() -> None:
        async with aio.Session(nobody, options=FAST) as session:
            for call in (
                lambda: session.fetch_reply(some_id(), timeout=1.0),
                lambda: session.request_durable(unique_uri("x"), b"", timeout=1.0),
                lambda: session.request(unique_uri("x"), b"", timeout=1.0),
            ):
                started = time.monotonic()
                with pytest.raises(RpcTimeoutError):
                    await call()
                assert time.monotonic() - started < 5

    asyncio.run(run())


def test_fetch_with_timeout_zero_takes_a_reply_the_broker_holds(broker: BrokerProcess) -> None:
    uri = unique_uri("durable-zero")

    def echo(request: Request) -> bytes:
        return request.payload

    with Session(broker.address, options=FAST) as session:
        with Worker(session, uri, echo):
            request_id = session.request_durable(uri, b"kept")
            assert session.fetch_reply(request_id, timeout=10).payload == b"kept"
        assert session.fetch_reply(request_id, timeout=0).payload == b"kept"


def test_arguments_of_the_wrong_type_are_invalid_arguments(broker: BrokerProcess) -> None:
    with Session(broker.address, options=FAST) as session:
        for bad in (
            lambda: session.fetch_reply(some_id(), timeout=None),  # type: ignore[arg-type]
            lambda: session.fetch_reply(some_id(), timeout=float("nan")),
            lambda: session.request_durable(unique_uri("x"), b"", keep="10"),  # type: ignore[arg-type]
            lambda: session.request_durable(unique_uri("x"), b"", timeout=float("nan")),
            lambda: session.request(unique_uri("x"), b"", timeout=float("inf")),
            lambda: session.request(unique_uri("x"), b"", timeout=None),  # type: ignore[arg-type]
        ):
            with pytest.raises(InvalidArgumentError):
                bad()


@pytest.mark.timeout(60)
def test_a_reply_fetched_again_has_its_streams_taken_at_once(broker: BrokerProcess) -> None:
    uri = unique_uri("durable-taken")
    data = bytes(range(256)) * 2000

    def handle(request: Request) -> StreamingReply:
        return StreamingReply(b"with-stream", {"kind": "k"}, {"data": io.BytesIO(data)})

    async def fetch_on_asyncio(request_id: str) -> None:
        async with aio.Session(broker.address, options=FAST) as asession:
            again = await asession.fetch_reply(request_id, timeout=10)
            assert again.payload == b"with-stream"
            with pytest.raises(StreamTakenError, match="earlier fetch_reply"):
                await again.streams["data"].read()
            with pytest.raises(StreamTakenError):
                async for _ in again.streams["data"]:
                    pass
            # and a reply first fetched on asyncio: that fetch marks its copy too
            own = await asession.request_durable(uri, b"go")
            fetched = await asession.fetch_reply(own, timeout=30)
            assert await fetched.streams["data"].read() == data
            refetched = await asession.fetch_reply(own, timeout=10)
            with pytest.raises(StreamTakenError):
                await refetched.streams["data"].read(10)

    with Session(broker.address, options=FAST) as session, Worker(session, uri, handle):
        request_id = session.request_durable(uri, b"go")
        first = session.fetch_reply(request_id, timeout=30)
        assert first.streams["data"].read() == data
        second = session.fetch_reply(request_id, timeout=10)
        assert (second.payload, second.properties) == (b"with-stream", {"kind": "k"})
        started = time.monotonic()
        with pytest.raises(StreamTakenError, match="earlier fetch_reply"):
            second.streams["data"].read(10)
        assert time.monotonic() - started < 5  # at once, not after the stall timeout
        asyncio.run(fetch_on_asyncio(request_id))


TOO_LONG = (2 * calls.MAX_TIMEOUT, 1e12)
"""Twenty years (the broker refused its pickup TTL, ``InvalidPropertiesError`` about
``x-ttl-ms``, a property the caller never set) and 1e12 s (``OverflowError`` from a
thread's wait on the threaded front-end)."""


def test_a_timeout_over_the_bound_is_an_invalid_argument_naming_it(broker: BrokerProcess) -> None:
    uri = unique_uri("long")
    bound = f"at most {calls.MAX_TIMEOUT:.0f} seconds"
    with Session(broker.address, options=FAST) as session, Worker(session, uri, lambda _: b"ok"):
        rid = session.request_durable(uri, b"")
        for too_long in TOO_LONG:
            with pytest.raises(InvalidArgumentError, match=f"^timeout must be {bound}"):
                session.request(uri, b"", timeout=too_long)
            with pytest.raises(InvalidArgumentError, match=f"^pickup_timeout must be {bound}"):
                session.request(uri, b"", pickup_timeout=too_long)
            with pytest.raises(InvalidArgumentError, match=f"^timeout must be {bound}"):
                session.request_durable(uri, b"", timeout=too_long)
            with pytest.raises(InvalidArgumentError, match=f"^timeout must be {bound}"):
                session.fetch_reply(rid, timeout=too_long)
        with pytest.raises(InvalidArgumentError, match=f"^keep must be at most {30 * 86400} "):
            session.request_durable(uri, b"", keep=1e12)
        # The bound itself is a call the broker takes.
        assert session.request(uri, b"", timeout=calls.MAX_TIMEOUT).payload == b"ok"

    async def on_the_loop() -> None:
        async with (
            aio.Session(broker.address, options=FAST) as session,
            aio.Worker(session, uri, lambda _: b"ok"),
        ):
            rid = await session.request_durable(uri, b"")
            for too_long in TOO_LONG:
                for call in (
                    session.request(uri, b"", timeout=too_long),
                    session.request_durable(uri, b"", timeout=too_long),
                    session.fetch_reply(rid, timeout=too_long),
                ):
                    with pytest.raises(InvalidArgumentError, match=f"^timeout must be {bound}"):
                        await call
            reply = await session.request(uri, b"", timeout=calls.MAX_TIMEOUT)
            assert reply.payload == b"ok"

    asyncio.run(on_the_loop())

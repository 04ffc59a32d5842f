"""Durable requests (Titanic): a reply fetched by request id from another process after
the caller was killed, kept for its keep time and then expired, and ids that are not
this token's refused with a typed error."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.broker.registry import SWEEP_INTERVAL
from holdfast.sdk import (
    InvalidArgumentError,
    RemoteHandlerError,
    ReplyExpiredError,
    Request,
    RpcTimeoutError,
    Session,
    SessionOptions,
    StreamingReply,
    UnknownRequestError,
    Worker,
    aio,
)
from holdfast.sdk.rpc import durable
from tests.rpc.support import ROOT, ChildProcess, worker_process
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until


@pytest.fixture
def session(broker: BrokerProcess) -> Iterator[Session]:
    """A session direct to the broker."""
    with Session(broker.address, options=FAST) as session:
        yield session


def fetch_in_new_process(address: str, request_id: str) -> str:
    """Run ``tests.rpc.durable_main fetch`` to its end; its one line of output."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.rpc.durable_main", address, "fetch", request_id],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_reply_fetched_by_a_new_process_after_the_caller_was_killed(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    uri, log = unique_uri("durable"), tmp_path / "runs.log"
    args = [broker.address, "post", uri, "order-7"]
    with ChildProcess("tests.rpc.durable_main", args, None) as caller:
        request_id = caller.first_line
        caller.kill()  # SIGKILL: nothing of the caller survives but the id
    durable.parse_request_id(request_id, None)  # a well-formed id was printed
    # The worker starts only now: the request waited in the broker for it.
    with worker_process(broker.address, uri, log):
        assert fetch_in_new_process(broker.address, request_id).startswith("reply order-7|")
        # Fetching does not use the reply up: another process gets it again.
        assert fetch_in_new_process(broker.address, request_id).startswith("reply order-7|")
    assert len(log.read_text().splitlines()) == 1  # the handler ran once


def test_reply_expires_after_its_keep_time(session: Session) -> None:
    uri = unique_uri("durable-expiry")
    with Worker(session, uri, lambda request: b"done:" + request.payload):
        request_id = session.request_durable(uri, b"x", keep=1.5)
        assert session.fetch_reply(request_id, timeout=10).payload == b"done:x"
        until = durable.parse_request_id(request_id, None).keep_until_ms / 1000
        wait_until(lambda: time.time() > until, 10, "the keep time to end")
        with pytest.raises(ReplyExpiredError):
            session.fetch_reply(request_id, timeout=5)
    # The broker dropped the reply too (its pickup TTL, swept every SWEEP_INTERVAL and
    # counted from its arrival): a reader of the reply queue gets nothing.
    wait_until(lambda: time.time() > until + 5 * SWEEP_INTERVAL, 10, "the broker's sweep")
    reply_uri = durable.parse_request_id(request_id, None).reply_uri
    seen: list[bytes] = []
    queue = session.open_queue(reply_uri, read=True, on_message=lambda m: seen.append(m.payload))
    assert not session.has_workers(uri)  # a round trip after the open: pushes came first
    queue.close()
    assert seen == []


def test_a_wait_that_reaches_the_keep_time_is_expired_not_a_timeout(session: Session) -> None:
    request_id = session.request_durable(unique_uri("nobody-serves"), b"x", keep=1.0)
    with pytest.raises(ReplyExpiredError):
        session.fetch_reply(request_id, timeout=30)


def test_no_reply_yet_is_a_timeout(session: Session) -> None:
    request_id = session.request_durable(unique_uri("nobody-yet"), b"x", keep=60)
    with pytest.raises(RpcTimeoutError) as raised:
        session.fetch_reply(request_id, timeout=0.3)
    assert not isinstance(raised.value, ReplyExpiredError)


def test_handler_error_is_fetched_as_the_calls_error(session: Session) -> None:
    uri = unique_uri("durable-error")

    def fail(request: Request) -> bytes:
        raise KeyError("no such order")

    with Worker(session, uri, fail):
        request_id = session.request_durable(uri, b"x")
        with pytest.raises(RemoteHandlerError) as raised:
            session.fetch_reply(request_id, timeout=10)
    assert raised.value.error_type == "KeyError"


def test_ids_not_of_this_token_are_unknown(broker: BrokerProcess, session: Session) -> None:
    request_id = session.request_durable(unique_uri("ids"), b"x", keep=60)
    for bad in ("", "nonsense", request_id[:-1] + ("0" if request_id[-1] != "0" else "1")):
        with pytest.raises(UnknownRequestError):
            session.fetch_reply(bad, timeout=1)
    other = SessionOptions(
        token="someone-else",
        keepalive_time=FAST.keepalive_time,
        keepalive_timeout=FAST.keepalive_timeout,
    )
    with Session(broker.address, options=other) as stranger, pytest.raises(UnknownRequestError):
        stranger.fetch_reply(request_id, timeout=1)
    # Not a str at all is the caller's mistake, not an id the broker forgot.
    for wrong in (None, 123, request_id.encode()):
        with pytest.raises(InvalidArgumentError, match="a request id is a str"):
            session.fetch_reply(wrong, timeout=1)  # type: ignore[arg-type]


def test_bad_keep_is_refused(session: Session) -> None:
    for keep in (0, -1, durable.MAX_REPLY_KEEP + 1):
        with pytest.raises(InvalidArgumentError):
            session.request_durable(unique_uri("keep"), b"x", keep=keep)


def test_asyncio_session_posts_and_fetches_the_same_ids(
    broker: BrokerProcess, session: Session
) -> None:
    uri = unique_uri("durable-aio")

    async def echo(request: Request) -> bytes:
        return b"aio:" + request.payload

    async def run() -> None:
        async with (
            aio.Session(broker.address, options=FAST) as asession,
            aio.Worker(asession, uri, echo),
        ):
            posted_here = await asession.request_durable(uri, b"a", keep=60)
            posted_there = await asyncio.to_thread(session.request_durable, uri, b"b")
            assert (await asession.fetch_reply(posted_there, timeout=10)).payload == b"aio:b"
            fetched = await asyncio.to_thread(session.fetch_reply, posted_here, 10)
            assert fetched.payload == b"aio:a"
            short = await asession.request_durable(unique_uri("nobody"), b"c", keep=0.5)
            with pytest.raises(ReplyExpiredError):
                await asession.fetch_reply(short, timeout=10)
            with pytest.raises(UnknownRequestError):
                await asession.fetch_reply(posted_here + "0", timeout=1)

    asyncio.run(run())


def test_reply_outlives_a_proxy_kill_between_post_and_fetch(broker: BrokerProcess) -> None:
    uri = unique_uri("durable-proxy")
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        with Session(proxy.address, options=FAST) as caller:
            request_id = caller.request_durable(uri, b"p", keep=60)
        proxy.kill()
        with (
            Session(broker.address, options=FAST) as worker_session,
            Worker(worker_session, uri, lambda request: b"via:" + request.payload),
        ):
            proxy.restart()
            with Session(proxy.address, options=FAST) as fetcher:
                assert fetcher.fetch_reply(request_id, timeout=20).payload == b"via:p"


def test_redelivered_durable_request_is_answered_once_from_the_kept_reply(
    broker: BrokerProcess,
) -> None:
    """The worker's link dies as its handler returns: the request comes back and is
    answered from the kept reply (its keep-time TTL now another value, so the broker
    answers CONFLICT: the first reply stands), and the fetch gets that one."""
    uri = unique_uri("durable-replay")
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        returned = threading.Event()

        def handle(request: Request) -> bytes:
            proxy.kill()  # the worker's link dies before the reply leaves
            returned.set()
            return b"once"

        with (
            Session(proxy.address, options=FAST) as worker_session,
            Worker(worker_session, uri, handle) as worker,
            Session(broker.address, options=FAST) as caller,
        ):
            request_id = caller.request_durable(uri, b"", keep=60)
            assert returned.wait(20)
            proxy.restart()
            assert caller.fetch_reply(request_id, timeout=30).payload == b"once"
            wait_until(lambda: worker.replies_replayed == 1, 20, "the kept reply to be replayed")
            assert worker.handler_runs == 1
            assert caller.fetch_reply(request_id, timeout=5).payload == b"once"


def test_a_durable_reply_s_data_streams_are_read_through_fetch_reply(
    session: Session, broker: BrokerProcess
) -> None:
    """A reply that carries a stream came back from ``fetch_reply`` without it: the
    worker's sender waited for credit and the chunks stayed in the broker."""
    uri = unique_uri("durable-streams")
    data = os.urandom(300_000)

    def handle(request: Request) -> StreamingReply:
        return StreamingReply(b"with-stream", streams={"data": io.BytesIO(data)})

    with Worker(session, uri, handle):
        request_id = session.request_durable(uri, b"go")
        reply = session.fetch_reply(request_id, timeout=30)
        assert reply.payload == b"with-stream"
        assert reply.streams["data"].read() == data

        async def fetch_on_asyncio() -> bytes:
            async with aio.Session(broker.address, options=FAST) as asession:
                again = await asession.request_durable(uri, b"go")
                fetched = await asession.fetch_reply(again, timeout=30)
                return b"".join([chunk async for chunk in fetched.streams["data"]])

        assert asyncio.run(fetch_on_asyncio()) == data

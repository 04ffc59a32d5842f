"""A handler that leaves many streams of its request unread answers at once: the
worker drains the readers together (``close_all``), not one after another, each of
which waits ``DRAIN_IDLE`` (0.2 s) for chunks still coming; 40 streams held a reply
8 s, and 200 left the caller with a timeout and the worker busy for 40 s."""

from __future__ import annotations

import asyncio
import io
import time

import pytest

from holdfast.sdk import RemoteHandlerError, Request, Session, Worker
from tests.rpc.support import aio_worker_and_caller
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri

pytestmark = pytest.mark.timeout(120)

STREAMS = 40


def streams() -> dict[str, io.BytesIO]:
    return {f"s{i}": io.BytesIO(b"tiny") for i in range(STREAMS)}


def refuse(request: Request) -> bytes:
    raise ValueError(f"not reading {len(request.streams)} streams")


async def refuse_async(request: Request) -> bytes:
    raise ValueError(f"not reading {len(request.streams)} streams")


def test_a_handler_that_reads_none_of_40_streams_answers_at_once(broker: BrokerProcess) -> None:
    uri = unique_uri("unread-many")
    with (
        Session(broker.address, options=FAST) as worker_session,
        Worker(worker_session, uri, refuse),
        Session(broker.address, options=FAST) as caller,
    ):
        started = time.monotonic()
        with pytest.raises(RemoteHandlerError, match="not reading 40 streams"):
            caller.request(uri, b"", streams=streams(), timeout=30)
        took = time.monotonic() - started
    assert took < 5, f"the reply took {took:.1f} s"


def test_an_asyncio_handler_that_reads_none_of_40_streams_answers_at_once(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("aio-unread-many")

    async def run() -> float:
        async with aio_worker_and_caller(broker.address, uri, refuse_async) as caller:
            started = time.monotonic()
            with pytest.raises(RemoteHandlerError, match="not reading 40 streams"):
                await caller.request(uri, b"", streams=streams(), timeout=30)
            return time.monotonic() - started

    took = asyncio.run(run())
    assert took < 5, f"the reply took {took:.1f} s"

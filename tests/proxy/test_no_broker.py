"""A proxy that reaches no broker answers at once, naming its upstream and why
(issue #34): a queue's first open fails with ``BrokerUnreachableError`` in well under
a second instead of timing out after 30 s with no reason; once a broker is there,
the same session opens the queue. And a gRPC error from the asyncio stack never
reaches a message as ``AioRpcError``'s multi-line repr."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest

from holdfast.sdk import Queue, Session
from holdfast.sdk import aio as hf_aio
from holdfast.sdk.errors import BrokerUnreachableError, UpstreamUnavailableError
from holdfast.sdk.transport import classify_rpc_error
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_first_open_fails_fast_naming_the_upstream_and_then_works(free_port: int) -> None:
    upstream = f"127.0.0.1:{free_port}"
    with ProxyProcess(["--upstream", upstream]) as proxy, Session(proxy.address) as session:
        began = time.monotonic()
        with pytest.raises(BrokerUnreachableError) as caught:
            session.open_queue("hf://d/q", write=True, timeout=30)
        assert time.monotonic() - began < 5
        text = str(caught.value)
        assert f"the proxy reaches no broker: never connected to {upstream}" in text
        assert "Connection refused" in text and "AioRpcError" not in text
        with BrokerProcess(port=free_port):
            opened: list[Queue] = []

            def opens() -> bool:  # until the proxy's back-off brings it to the broker
                with contextlib.suppress(BrokerUnreachableError):
                    opened.append(session.open_queue("hf://d/q", write=True, timeout=30))
                return bool(opened)

            wait_until(opens, 30, "the open to succeed")
            opened[0].post(b"after")
            assert session.flush(10)
        assert "refusing" in proxy.output and upstream in proxy.output


def test_the_asyncio_session_fails_fast_too(free_port: int) -> None:
    async def main(address: str) -> str:
        async with hf_aio.Session(address) as session:
            with pytest.raises(BrokerUnreachableError) as caught:
                await session.open_queue("hf://d/q", write=True, timeout=30)
            return str(caught.value)

    with ProxyProcess(["--upstream", f"127.0.0.1:{free_port}"]) as proxy:
        text = asyncio.run(main(proxy.address))
    assert "the proxy reaches no broker" in text


def test_an_aio_rpc_error_is_read_by_its_code_and_details() -> None:
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="failed to connect to all addresses",
    )
    text = str(classify_rpc_error(error))
    assert text == "UNAVAILABLE: failed to connect to all addresses"
    refused = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="the proxy reaches no broker: never connected to 127.0.0.1:1",
    )
    assert isinstance(classify_rpc_error(refused), UpstreamUnavailableError)

"""Data streams of the asyncio API across a proxy restart: caller and worker both reach
the broker through one proxy, killed and restarted once while the request stream is
sent and read and once while the reply stream is: every chunk the broker redelivers
reaches its reader once, in order (content checked by SHA-256 both ways)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from holdfast.sdk import Request, StreamingReply, aio
from tests.rpc.test_aio_streams import digest_stream, pieces_of
from tests.rpc.test_streams import MB, Source
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri

SIZE = 20 * MB


@pytest.mark.timeout(240)
def test_a_stream_each_way_through_a_proxy_restarted_mid_stream(broker: BrokerProcess) -> None:
    uri = unique_uri("aio-streams-proxy")
    sent: list[Source] = []
    with ProxyProcess(["--upstream", broker.address]) as proxy:

        def bounce() -> None:
            proxy.kill()
            proxy.restart()

        async def handle(request: Request) -> StreamingReply:
            total, hexdigest = await digest_stream(request.streams["data"])
            source = Source(SIZE + 11)
            sent.append(source)
            return StreamingReply(f"{total}:{hexdigest}".encode(), {}, {"out": pieces_of(source)})

        # Read in the executor, so the restart's blocking waits stay off the loop.
        source = Source(SIZE, {8 * MB: bounce})

        async def run() -> None:
            async with (
                aio.Session(proxy.address, options=FAST) as worker_session,
                aio.Worker(worker_session, uri, handle),
                aio.Session(proxy.address, options=FAST) as caller,
            ):
                reply = await caller.request(uri, b"", streams={"data": source}, timeout=180)
                assert not source._hooks  # the proxy was restarted mid-stream
                assert reply.payload.decode() == f"{SIZE}:{source.digest.hexdigest()}"
                assert caller.stats().reconnects >= 1
                assert worker_session.stats().reconnects >= 1

                reconnects = caller.stats().reconnects
                digest, total = hashlib.sha256(), 0
                async for chunk in reply.streams["out"]:
                    if total < 8 * MB <= total + len(chunk):
                        await asyncio.to_thread(bounce)
                    digest.update(chunk)
                    total += len(chunk)
                assert caller.stats().reconnects > reconnects  # the reader lost its link
                assert total == SIZE + 11
                assert digest.hexdigest() == sent[0].digest.hexdigest()

        asyncio.run(run())

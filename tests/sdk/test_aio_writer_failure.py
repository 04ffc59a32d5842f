"""The asyncio driver when its writer fails with something that is not the link (an
encoding bug, say): the writer closes the connection, and grpc.aio then raises
``CancelledError`` from the reader's pending read. That read used to re-raise it and
end the driver's task silently, leaving the session (and a proxy's whole upstream)
dead with nothing logged; now the connection ends, is reported, and the session
reconnects and delivers its PUTs."""

from __future__ import annotations

import asyncio
import logging

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import ack_batch, read_puts
from holdfast.sdk import AckStatus, aio
from holdfast.sdk.types import Ack
from tests.support.fake_broker import client_frames, handshake_answer

pytestmark = pytest.mark.timeout(30)


class GrpcLikeConnection:
    """Answers Hello and OpenQueue and ACKs PUTs; ``fail`` makes the first PUT frame's
    send raise ValueError. Once closed, a pending read raises ``CancelledError``, as
    grpc.aio's does when its call is cancelled."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = asyncio.Event()

    async def send(self, data: bytes) -> None:
        for frame in client_frames(data):
            answer = handshake_answer(frame)
            if answer is not None:
                self.inbound.put_nowait(answer)
            if frame.WhichOneof("frame") == "puts":
                if self.fail:
                    raise ValueError("a frame that cannot be encoded")
                puts = read_puts(frame.puts)
                acks = ack_batch(
                    [(q, g, pb.STATUS_OK) for q, g in zip(puts.queue_ids, puts.guids, strict=True)]
                )
                self.inbound.put_nowait(pb.ServerFrame(acks=acks).SerializeToString())

    async def receive(self) -> bytes | None:
        get = asyncio.ensure_future(self.inbound.get())
        closed = asyncio.ensure_future(self.closed.wait())
        done, pending = await asyncio.wait([get, closed], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if get in done:
            return get.result()
        raise asyncio.CancelledError

    async def finish(self) -> None:
        self.inbound.put_nowait(None)

    async def close(self) -> None:
        self.closed.set()


class FailingOnceTransport:
    def __init__(self) -> None:
        self.connections: list[GrpcLikeConnection] = []

    async def connect(self, address: str) -> GrpcLikeConnection:
        connection = GrpcLikeConnection(fail=not self.connections)
        self.connections.append(connection)
        return connection


def test_a_failed_writer_ends_the_connection_and_the_session_reconnects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> tuple[list[Ack], int]:
        transport = FailingOnceTransport()
        acks: list[Ack] = []
        async with aio.Session("scripted:1", transport=transport) as session:
            queue = await session.open_queue("hf://test/w", write=True, on_ack=acks.append)
            await queue.post(b"x")
            assert await session.flush(10)
        return acks, len(transport.connections)

    with caplog.at_level(logging.WARNING, logger="holdfast.sdk.driver"):
        acks, connections = asyncio.run(main())
    assert [ack.status for ack in acks] == [AckStatus.SUCCESS]
    assert connections == 2
    assert "a frame that cannot be encoded" in caplog.text

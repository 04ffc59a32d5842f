"""The asyncio driver's writer, against a scripted connection: CONFIRMs of PUSH frames
that arrive one after another leave together, not a gRPC message per PUSH
(``holdfast.sdk.turns``)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import push_batch, read_confirms
from holdfast.sdk import aio
from holdfast.sdk.types import Message
from tests.support.fake_broker import client_frames, handshake_answer

pytestmark = pytest.mark.timeout(30)

PUSHES = 60


class ScriptedConnection:
    """A broker that answers Hello and OpenQueue, then sends ``PUSHES`` PUSH frames of
    one message each, handing one over per turn of the loop (as grpc.aio's reads do),
    and records what the client sent, one list of frames per gRPC message."""

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.sent: list[list[pb.ClientFrame]] = []

    async def send(self, data: bytes) -> None:
        frames = client_frames(data)
        self.sent.append(frames)
        for frame in frames:
            answer = handshake_answer(frame)
            if answer is not None:
                self.inbound.put_nowait(answer)
            if frame.WhichOneof("frame") == "open_queue":
                request = frame.open_queue
                for _ in range(PUSHES):
                    batch = push_batch([request.queue_id], [uuid.uuid4().bytes], [b"x"], [1], [0])
                    self.inbound.put_nowait(pb.ServerFrame(pushes=batch).SerializeToString())

    async def receive(self) -> bytes | None:
        await asyncio.sleep(0)
        return await self.inbound.get()

    async def finish(self) -> None:
        self.inbound.put_nowait(None)

    async def close(self) -> None:
        self.inbound.put_nowait(None)

    def confirms_per_message(self) -> list[int]:
        """How many CONFIRMs each gRPC message carried (those that carried any)."""
        counts = [
            sum(
                len(read_confirms(f.confirms))
                for f in frames
                if f.WhichOneof("frame") == "confirms"
            )
            for frames in self.sent
        ]
        return [count for count in counts if count]


class ScriptedTransport:
    def __init__(self) -> None:
        self.connection = ScriptedConnection()

    async def connect(self, address: str) -> ScriptedConnection:
        return self.connection


async def confirm_all() -> list[int]:
    transport = ScriptedTransport()
    done = asyncio.Event()
    confirmed = 0

    def on_message(message: Message) -> None:
        nonlocal confirmed
        message.confirm()
        confirmed += 1
        if confirmed == PUSHES:
            done.set()

    async with aio.Session("scripted:1", transport=transport) as session:
        await session.open_queue("hf://test/writer", read=True, on_message=on_message)
        await asyncio.wait_for(done.wait(), 10)
        for _ in range(20):  # let the writer send the last CONFIRMs
            await asyncio.sleep(0)
        counts = transport.connection.confirms_per_message()
    assert sum(counts) == PUSHES
    return counts


def test_confirms_of_pushes_read_one_after_another_leave_together() -> None:
    counts = asyncio.run(confirm_all())
    # Woken by the first CONFIRM, the writer lets the loop run (once, and twice more
    # while the reader has PUSHes to hand over) before it takes: several CONFIRMs a
    # message (four here; two with one turn, one with none).
    assert len(counts) <= PUSHES // 4, counts

"""The served stream's writer, with a scripted gRPC context: answers to frames that
gRPC has already read leave in one message, not a message per answer."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from holdfast.proto import PROTOCOL_VERSION, pb
from holdfast.proto.batching import BATCH_OVERHEAD
from holdfast.proto.columns import PutColumns, RejectRow
from holdfast.server.stream import ContractStream

pytestmark = pytest.mark.timeout(30)


class ScriptedContext:
    """A servicer context whose client sent ``frames`` at once: each read hands the
    next one over on a later turn of the loop, as grpc.aio's reads do."""

    def __init__(self, frames: list[pb.ClientFrame]) -> None:
        self._frames = [frame.SerializeToString() for frame in frames]
        self.written: list[bytes] = []

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def read(self) -> Any:
        await asyncio.sleep(0)
        return self._frames.pop(0) if self._frames else grpc.aio.EOF

    async def write(self, data: bytes) -> None:
        self.written.append(data)

    def cancelled(self) -> bool:
        return False

    def set_code(self, code: grpc.StatusCode) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass


class CountingStream(ContractStream):
    """Answers Hello and CountConsumers; nothing else is sent in these tests."""

    def greet(self, hello: pb.Hello) -> None:
        self.send(pb.ServerFrame(hello_reply=pb.HelloReply(accepts_batches=True)))

    def on_count_consumers(self, request: pb.CountConsumers) -> None:
        self.count_answer(request.request_id, 0)

    def _unexpected(self, frame: object) -> None:
        raise AssertionError(f"not sent in these tests: {frame!r}")

    def on_open(self, request: pb.OpenQueue) -> None:
        self._unexpected(request)

    def on_configure(self, request: pb.ConfigureQueue) -> None:
        self._unexpected(request)

    def on_close(self, request: pb.CloseQueue) -> None:
        self._unexpected(request)

    def on_puts(self, batch: PutColumns) -> None:
        self._unexpected(batch)

    def on_confirms(self, batch: list[tuple[int, bytes]]) -> None:
        self._unexpected(batch)

    def on_rejects(self, batch: list[RejectRow]) -> None:
        self._unexpected(batch)

    def on_end(self) -> None:
        pass


def messages(written: list[bytes]) -> list[list[str]]:
    """The frame kinds of each written gRPC message (a batch's frames in order)."""
    out = []
    for data in written:
        frame = pb.ServerFrame.FromString(data)
        inner = frame.batch.frames if frame.WhichOneof("frame") == "batch" else [frame]
        out.append([each.WhichOneof("frame") or "" for each in inner])
    return out


def test_answers_to_frames_already_read_leave_as_one_message() -> None:
    hello = pb.Hello(protocol_version=PROTOCOL_VERSION, accepts_batches=True)
    counts = [pb.CountConsumers(request_id=n, uri="hf://t/q") for n in (1, 2, 3)]
    context = ScriptedContext(
        [pb.ClientFrame(hello=hello)] + [pb.ClientFrame(count_consumers=c) for c in counts]
    )
    stream = CountingStream(context, "s1", 1 << 20, 1 << 20)
    asyncio.run(stream.run())
    kinds = messages(context.written)
    assert [kind for message in kinds for kind in message] == ["hello_reply"] + [
        "consumer_count"
    ] * 3
    # Woken by the first answer, the writer waits one turn: the frames gRPC handed
    # over meanwhile are answered in the same message. Without that turn each
    # answer went alone (a message per input frame).
    assert len(kinds) <= 2, kinds


def test_a_message_never_exceeds_the_frame_size() -> None:
    hello = pb.Hello(protocol_version=PROTOCOL_VERSION, accepts_batches=True)
    counts = [pb.CountConsumers(request_id=n, uri="hf://t/q") for n in range(1, 200)]
    context = ScriptedContext(
        [pb.ClientFrame(hello=hello)] + [pb.ClientFrame(count_consumers=c) for c in counts]
    )
    limit = 64
    stream = CountingStream(context, "s1", limit, 1 << 20)
    asyncio.run(stream.run())
    kinds = [kind for message in messages(context.written) for kind in message]
    assert kinds.count("consumer_count") == 199
    one = len(pb.ServerFrame(consumer_count=pb.ConsumerCount(request_id=199)).SerializeToString())
    assert max(map(len, context.written)) <= max(limit, one + BATCH_OVERHEAD) + BATCH_OVERHEAD

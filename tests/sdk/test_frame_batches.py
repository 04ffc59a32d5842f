"""Several frames in one gRPC message (``ClientFrames`` / ``ServerFrames``) on the SDK's
side, with no I/O: the core batches what one take produced only for a server whose
HelloReply accepts batches, and handles each frame of a server's batch in order."""

from __future__ import annotations

import logging

import pytest

from holdfast.proto import pb
from holdfast.proto.batching import pack, packed
from holdfast.proto.columns import push_batch
from holdfast.sdk import SessionOptions
from holdfast.sdk.driver.core import DriverCore
from holdfast.sdk.engine import SessionEngine
from holdfast.sdk.errors import RemoteProtocolError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.types import Ack, Message
from tests.support.columns import puts_of
from tests.support.fake_broker import HELLO_REPLY

URI = "hf://test/batches"


class Rig:
    """A core and its engine, connected to a server that does or does not read batches."""

    def __init__(self, server_batches: bool) -> None:
        self.messages: list[Message] = []
        self.acks: list[Ack] = []
        self.engine = SessionEngine(
            client_id="c", on_event=lambda e: None, confirmer=lambda m, reject=None: None
        )
        self.core = DriverCore(self.engine, ["a:1"], SessionOptions(), logging.getLogger())
        assert self.core.begin(0.0) is not None
        hello = self.engine.take_outbound()
        assert [item.hello.accepts_batches for item in hello] == [True]  # type: ignore[union-attr]
        reply = pb.ServerFrame.FromString(HELLO_REPLY)
        reply.hello_reply.accepts_batches = server_batches
        self.core.receive(self.core.generation, reply.SerializeToString(), 0.0)
        record, _ = self.engine.open_queue(
            URI,
            read=True,
            write=True,
            options=QueueOptions(),
            on_message=self.messages.append,
            on_ack=self.acks.append,
        )
        self.queue_id = record.queue_id
        (opened,) = self.engine.take_outbound()
        response = pb.Response(request_id=opened.open_queue.request_id, status=pb.STATUS_OK)  # type: ignore[union-attr]
        self.core.receive(
            self.core.generation, pb.ServerFrame(response=response).SerializeToString(), 0.0
        )
        self.run_callbacks()

    def run_callbacks(self) -> None:
        for function, argument in self.engine.take_callbacks():
            function(argument)

    def put_and_confirm(self) -> list[pb.ClientFrame]:
        """Post a PUT and confirm a delivered message; the frames of one take, parsed."""
        self.core.receive(self.core.generation, push(self.queue_id, b"\x01" * 16), 0.0)
        self.run_callbacks()
        self.engine.post(self.queue_id, b"payload", {"k": "v"}, None, 0.0)
        self.messages[-1].confirm()
        return [pb.ClientFrame.FromString(raw) for raw, _ in self.core.frames(
            self.engine.take_outbound(), 0.0
        )]  # fmt: skip


def push(queue_id: int, guid: bytes) -> bytes:
    batch = push_batch([queue_id], [guid], [b""], [1], [0])
    return pb.ServerFrame(pushes=batch).SerializeToString()


def test_a_put_and_a_confirm_leave_as_one_message_to_a_server_that_reads_batches() -> None:
    rig = Rig(server_batches=True)
    rig.engine._confirmer = rig.engine.confirm
    (frame,) = rig.put_and_confirm()
    assert frame.WhichOneof("frame") == "batch"
    assert [f.WhichOneof("frame") for f in frame.batch.frames] == ["puts", "confirms"]
    assert puts_of(frame.batch.frames[0].puts)[0].properties == {"k": "v"}


def test_a_server_that_does_not_read_batches_gets_one_frame_a_message() -> None:
    rig = Rig(server_batches=False)
    rig.engine._confirmer = rig.engine.confirm
    frames = rig.put_and_confirm()
    assert [f.WhichOneof("frame") for f in frames] == ["puts", "confirms"]


def test_each_frame_of_a_servers_batch_is_handled_in_order() -> None:
    rig = Rig(server_batches=True)
    guids = [bytes([n]) * 16 for n in (1, 2, 3)]
    rig.core.receive(rig.core.generation, pack([push(rig.queue_id, g) for g in guids]), 0.0)
    rig.run_callbacks()
    assert [m.guid.bytes for m in rig.messages] == guids


def test_a_hello_reply_inside_a_batch_ends_the_connection() -> None:
    rig = Rig(server_batches=True)
    with pytest.raises(RemoteProtocolError, match="inside a batch"):
        rig.core.receive(rig.core.generation, pack([HELLO_REPLY]), 0.0)


def test_batches_stay_under_their_size_and_a_lone_frame_goes_as_it_is() -> None:
    frames = [(bytes(300), 1), (bytes(300), 2), (bytes(980), 4), (bytes(10), 8)]
    out = list(packed(frames, 1000))
    assert [accounted for _, accounted in out] == [3, 4, 8]
    assert out[1][0] == bytes(980) and out[2][0] == bytes(10)
    assert all(len(data) <= 1000 for data, _ in out)

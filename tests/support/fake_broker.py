"""A scripted broker for server-side faults: real gRPC on 127.0.0.1, wire frames by hand.

It answers Hello and queue requests with OK, ACKs PUTs (unless told not to),
ignores CONFIRMs, and on the first ``bad_connections`` connections (all of them
when None) sends ``bad_frame`` right after answering an open of a readable queue,
as raw bytes the client has to parse itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Self

import grpc

from holdfast.proto import PROTOCOL_VERSION, SERVICE_NAME, pb

BadFrame = Callable[[int], bytes]
"""Builds the bad frame for a queue id."""


def push_with_short_guid(queue_id: int) -> bytes:
    """A PUSH whose GUID is 3 bytes instead of 16."""
    push = pb.Push(queue_id=queue_id, guid=b"abc", payload=b"x", delivery_count=1)
    return pb.ServerFrame(pushes=pb.PushBatch(pushes=[push])).SerializeToString()


def unparseable(queue_id: int) -> bytes:
    """Bytes that are no ServerFrame at all (a truncated varint)."""
    return b"\xff\xff\xff"


HELLO_REPLY = pb.ServerFrame(
    hello_reply=pb.HelloReply(
        protocol_version=PROTOCOL_VERSION,
        session_id="fake",
        dedup_window_ms=300_000,
        max_payload_bytes=4 * 1024 * 1024,
        max_properties=64,
        max_properties_bytes=64 * 1024,
        broker_id="fake-broker",
    )
).SerializeToString()


class FakeBroker:
    """``with FakeBroker(bad) as fake: ... fake.address``; ``connections`` counts streams."""

    def __init__(
        self, bad_frame: BadFrame, bad_connections: int | None = None, ack_puts: bool = True
    ) -> None:
        self._bad_frame = bad_frame
        self._bad_connections = bad_connections
        self._ack_puts = ack_puts
        self._lock = threading.Lock()
        self.connections = 0
        self.acked = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        handler = grpc.stream_stream_rpc_method_handler(self._session)  # raw bytes both ways
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, {"Session": handler}),)
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.stop(0).wait(5)

    def _session(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        with self._lock:
            self.connections += 1
            bad = self._bad_connections is None or self.connections <= self._bad_connections
        for data in requests:
            frame = pb.ClientFrame.FromString(data)
            kind = frame.WhichOneof("frame")
            if kind == "hello":
                yield HELLO_REPLY
            elif kind in ("open_queue", "configure_queue", "close_queue"):
                request = getattr(frame, kind)
                response = pb.Response(request_id=request.request_id, status=pb.STATUS_OK)
                yield pb.ServerFrame(response=response).SerializeToString()
                if bad and kind == "open_queue" and request.read:
                    yield self._bad_frame(request.queue_id)
            elif kind == "puts" and self._ack_puts:
                acks = [
                    pb.Ack(queue_id=p.queue_id, guid=p.guid, status=pb.STATUS_OK)
                    for p in frame.puts.puts
                ]
                with self._lock:
                    self.acked += len(acks)
                yield pb.ServerFrame(acks=pb.AckBatch(acks=acks)).SerializeToString()

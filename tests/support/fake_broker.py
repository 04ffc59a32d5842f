"""A scripted broker for server-side faults: real gRPC on 127.0.0.1, wire frames by hand.

A ``Script`` answers Hello and queue requests with OK, ACKs PUTs (unless told
not to), ignores CONFIRMs, and on the first ``bad_connections`` connections (all
of them when None) sends ``bad_frame`` right after answering an open of a
readable queue, as raw bytes the client has to parse itself, and ACKs PUTs with
the status byte ``bad_ack_status`` if one is given. ``FakeBroker``
serves it over real gRPC, ``serve_in_memory`` over the in-memory transport.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Self, cast

import grpc

from holdfast.proto import PROTOCOL_VERSION, SERVICE_NAME, pb
from holdfast.proto.columns import ack_batch, read_puts
from holdfast.sdk.errors import TransportError
from holdfast.sdk.transports import MemoryEndpoint, MemoryNetwork

BadFrame = Callable[[int], bytes]
"""Builds the bad frame for a queue id."""


def push_with_short_guid(queue_id: int) -> bytes:
    """A PUSH batch whose GUIDs column is 3 bytes instead of 16 per message."""
    batch = pb.PushBatch(queue_ids=[queue_id], guids=b"abc", payloads=b"x", payload_lengths=[1])
    return pb.ServerFrame(pushes=batch).SerializeToString()


def push_with_stray_properties(queue_id: int) -> bytes:
    """A PUSH batch of one message whose property group names a second message."""
    batch = pb.PushBatch(
        queue_ids=[queue_id],
        guids=b"g" * 16,
        payloads=b"x",
        payload_lengths=[1],
        property_groups=[pb.PropertyGroup(indexes=[0, 1], keys=["k"], values=["v", "w"])],
    )
    return pb.ServerFrame(pushes=batch).SerializeToString()


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


def client_frames(data: bytes) -> list[pb.ClientFrame]:
    """The frames of one gRPC message from a client (a ``ClientFrames`` batch or one)."""
    message = pb.ClientFrame.FromString(data)
    return list(message.batch.frames) if message.WhichOneof("frame") == "batch" else [message]


def handshake_answer(frame: pb.ClientFrame) -> bytes | None:
    """The answer to a Hello (``HELLO_REPLY``, batches accepted) or an OpenQueue (OK);
    None for any other frame."""
    kind = frame.WhichOneof("frame")
    if kind == "hello":
        reply = pb.ServerFrame.FromString(HELLO_REPLY)
        reply.hello_reply.accepts_batches = True
        return reply.SerializeToString()
    if kind == "open_queue":
        ok = pb.Response(request_id=frame.open_queue.request_id, status=pb.STATUS_OK)
        return pb.ServerFrame(response=ok).SerializeToString()
    return None


class Script:
    """The fake broker's answers; one per server, shared by its connections."""

    def __init__(
        self,
        bad_frame: BadFrame | None,
        bad_connections: int | None = None,
        ack_puts: bool = True,
        bad_ack_status: int | None = None,
    ) -> None:
        self._bad_frame = bad_frame
        self._bad_ack_status = bad_ack_status
        self._bad_connections = bad_connections
        self._ack_puts = ack_puts
        self._lock = threading.Lock()
        self.connections = 0
        """Streams opened so far."""
        self.answer_hello = True
        """False: accept connections but never answer Hello."""

    def connection(self) -> Callable[[bytes], list[bytes]]:
        """Count a new stream; return what answers its frames."""
        with self._lock:
            self.connections += 1
            bad = self._bad_connections is None or self.connections <= self._bad_connections
        return lambda data: self._answer(pb.ClientFrame.FromString(data), bad)

    def _answer(self, frame: pb.ClientFrame, bad: bool) -> list[bytes]:
        kind = frame.WhichOneof("frame")
        if kind == "hello":
            return [HELLO_REPLY] if self.answer_hello else []
        if kind in ("open_queue", "configure_queue", "close_queue"):
            request = getattr(frame, kind)
            response = pb.Response(request_id=request.request_id, status=pb.STATUS_OK)
            out = [pb.ServerFrame(response=response).SerializeToString()]
            if bad and kind == "open_queue" and request.read and self._bad_frame is not None:
                out.append(self._bad_frame(request.queue_id))
            return out
        if kind == "puts" and self._ack_puts:
            status = pb.STATUS_OK
            if bad and self._bad_ack_status is not None:
                # Any byte: ``ack_batch`` packs the statuses column without checking it.
                status = cast(pb.Status, self._bad_ack_status)
            acks = [(p.queue_id, p.guid, status) for p in read_puts(frame.puts).rows()]
            return [pb.ServerFrame(acks=ack_batch(acks)).SerializeToString()]
        return []


class FakeBroker:
    """``with FakeBroker(Script(bad)) as fake: ... fake.address``, over real gRPC."""

    def __init__(self, script: Script) -> None:
        self.script = script
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

    @property
    def connections(self) -> int:
        """Streams opened so far."""
        return self.script.connections

    def __enter__(self) -> Self:
        self._server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.stop(0).wait(5)

    def _session(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        answer = self.script.connection()
        for data in requests:
            yield from answer(data)


def serve_in_memory(network: MemoryNetwork, address: str, script: Script) -> None:
    """Answer connections to ``address`` on ``network`` with ``script``, a thread each."""

    def serve(endpoint: MemoryEndpoint) -> None:
        answer = script.connection()
        try:
            while (data := endpoint.receive()) is not None:
                for frame in answer(data):
                    endpoint.send(frame)
        except TransportError:
            return  # the client dropped the connection
        endpoint.close()

    network.listen(
        address,
        lambda endpoint: threading.Thread(target=serve, args=(endpoint,), daemon=True).start(),
    )

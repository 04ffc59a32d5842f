"""A bare, synchronous client of the wire contract, for testing brokers and proxies.

No HA logic: it sends exactly the frames a test asks for, including bytes that are
not a frame at all, and hands back every frame the server sends.

The stream is opened on the session method with an identity request serializer,
so ``send()`` (a ``ClientFrame``) and ``send_raw()`` (any bytes) share one stream;
responses are parsed with the generated ``ServerFrame``. A thread receives frames
into a queue; ``recv()`` takes the next one of a kind and keeps the others, in
order, for later calls.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc

from holdfast.proto import PROTOCOL_VERSION, SESSION_METHOD, pb
from holdfast.proto.columns import confirm_batch, put_batch
from tests.support.columns import AckView, PushView, acks_of, pushes_of

DEFAULT_TIMEOUT = 10.0
"""Seconds a ``recv`` waits by default."""

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

BARRIER_QUEUE_ID = 2**32 - 1
"""The queue_id ``barrier()`` uses; tests must not open it."""

PutItem = tuple[bytes, bytes, Mapping[str, str]]
"""One PUT as (guid, payload, properties)."""


class StreamEnded(Exception):
    """The server ended the stream; ``code`` and ``details`` are its gRPC status."""

    def __init__(self, code: Any, details: str) -> None:
        super().__init__(f"stream ended: {code} {details}")
        self.code = code
        self.details = details


_END = object()


def _identity(data: bytes) -> bytes:
    return data


class WireClient:
    """One session stream to ``address`` (``HOST:PORT``).

    With ``receive=False`` nothing reads the stream: a client that stops reading, so
    that gRPC flow control pushes back on the server (``recv`` then times out).
    ``token`` goes as ``authorization: Bearer`` metadata, like the SDK's.
    """

    def __init__(self, address: str, receive: bool = True, token: str | None = None) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        method = self._channel.stream_stream(
            SESSION_METHOD,
            request_serializer=_identity,
            response_deserializer=pb.ServerFrame.FromString,
        )
        self._outgoing: queue.Queue[bytes | object] = queue.Queue()
        self._incoming: queue.Queue[pb.ServerFrame | object] = queue.Queue()
        self._kept: list[pb.ServerFrame] = []
        self._ended: StreamEnded | None = None
        self._next_request_id = 1
        self.hello_reply: pb.HelloReply | None = None
        """What the server answered to ``hello()``."""
        metadata = None if token is None else (("authorization", f"Bearer {token}"),)
        self._call = method(self._requests(), metadata=metadata)
        self._receiver = threading.Thread(target=self._receive, daemon=True)
        if receive:
            self._receiver.start()

    # -- raw sending and receiving ----------------------------------------------------

    def _requests(self) -> Iterator[bytes]:
        while True:
            item = self._outgoing.get()
            if item is _END:
                return
            assert isinstance(item, bytes)
            yield item

    def _receive(self) -> None:
        try:
            for frame in self._call:
                self._incoming.put(frame)
            self._ended = StreamEnded(self._call.code(), self._call.details() or "")
        except grpc.RpcError as error:
            self._ended = StreamEnded(error.code(), error.details() or "")
        finally:
            self._incoming.put(_END)

    def send(self, frame: pb.ClientFrame) -> None:
        """Send one frame."""
        self._outgoing.put(frame.SerializeToString())

    def send_raw(self, data: bytes) -> None:
        """Send ``data`` as one message of the stream, whatever it is."""
        self._outgoing.put(bytes(data))

    def recv(self, kind: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> pb.ServerFrame:
        """The next frame (of ``kind``, a ``ServerFrame`` oneof name, if given).
        Raises ``StreamEnded`` if the stream ends first, ``TimeoutError`` after
        ``timeout`` seconds."""
        frame = self.poll(kind, timeout)
        if frame is None:
            if self._ended is not None:
                raise self._ended
            raise TimeoutError(f"no {kind or 'frame'} within {timeout} s")
        return frame

    def poll(self, kind: str | None = None, timeout: float = 0.0) -> pb.ServerFrame | None:
        """Like ``recv`` but returns ``None`` when nothing came (or the stream ended)."""
        for index, frame in enumerate(self._kept):
            if kind is None or frame.WhichOneof("frame") == kind:
                del self._kept[index]
                return frame
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                item = (
                    self._incoming.get(timeout=max(remaining, 0.0))
                    if remaining > 0
                    else (self._incoming.get_nowait())
                )
            except queue.Empty:
                return None
            if item is _END:
                self._incoming.put(_END)  # stays ended for every later call
                return None
            assert isinstance(item, pb.ServerFrame)
            if kind is None or item.WhichOneof("frame") == kind:
                return item
            self._kept.append(item)

    def recv_until(
        self,
        kind: str,
        done: Callable[[list[pb.ServerFrame]], bool],
        timeout: float = DEFAULT_TIMEOUT,
        what: str = "",
    ) -> list[pb.ServerFrame]:
        """Collect frames of ``kind`` until ``done(frames)`` holds; ``TimeoutError`` after
        ``timeout`` seconds."""
        frames: list[pb.ServerFrame] = []
        deadline = time.monotonic() + timeout
        while not done(frames):
            remaining = deadline - time.monotonic()
            frame = self.poll(kind, remaining) if remaining > 0 else None
            if frame is None:
                if self._ended is not None and remaining > 0:
                    raise self._ended
                raise TimeoutError(
                    f"timed out after {timeout} s waiting for {what or kind}; got {len(frames)}"
                )
            frames.append(frame)
        return frames

    def acks(self, count: int, timeout: float = DEFAULT_TIMEOUT) -> list[AckView]:
        """Receive ACKs until at least ``count`` arrived; return them in order."""
        frames = self.recv_until(
            "acks",
            lambda fs: sum(len(f.acks.guids) // 16 for f in fs) >= count,
            timeout,
            f"{count} ACKs",
        )
        return [ack for frame in frames for ack in acks_of(frame.acks)]

    def pushes(self, count: int, timeout: float = DEFAULT_TIMEOUT) -> list[PushView]:
        """Receive PUSHes until at least ``count`` arrived; return them in order."""
        frames = self.recv_until(
            "pushes",
            lambda fs: sum(len(f.pushes.guids) // 16 for f in fs) >= count,
            timeout,
            f"{count} PUSHes",
        )
        return [push for frame in frames for push in pushes_of(frame.pushes)]

    def quiet(self, kind: str, within: float) -> list[pb.ServerFrame]:
        """Every frame of ``kind`` that arrives within ``within`` seconds (a bounded wait
        for a test that expects nothing more)."""
        frames: list[pb.ServerFrame] = []
        deadline = time.monotonic() + within
        while (remaining := deadline - time.monotonic()) > 0:
            frame = self.poll(kind, remaining)
            if frame is None:
                break
            frames.append(frame)
        return frames

    def ended(self, timeout: float = DEFAULT_TIMEOUT) -> StreamEnded:
        """Wait for the server to end the stream; its status. Frames still unread are
        kept for ``recv``."""
        if not self._receiver.is_alive() and self._ended is None:
            raise RuntimeError("this client does not receive (receive=False)")
        self._receiver.join(timeout)
        if self._ended is None:
            raise TimeoutError(f"the stream did not end within {timeout} s")
        return self._ended

    # -- the protocol ---------------------------------------------------------------

    def hello(
        self,
        protocol_version: int = PROTOCOL_VERSION,
        client_id: str = "wire-client",
        client_name: str = "tests.support.wire_client",
        timeout: float = DEFAULT_TIMEOUT,
        accepts_batches: bool = False,
        relays_clients: bool = False,
    ) -> pb.HelloReply:
        """Send Hello and return the HelloReply (``accepts_batches``: the server may
        then send ``ServerFrames``, which ``recv`` hands back as they are;
        ``relays_clients``: this client says it is a proxy)."""
        self.send_hello(protocol_version, client_id, client_name, accepts_batches, relays_clients)
        reply: pb.HelloReply = self.recv("hello_reply", timeout).hello_reply
        self.hello_reply = reply
        return reply

    def send_hello(
        self,
        protocol_version: int = PROTOCOL_VERSION,
        client_id: str = "wire-client",
        client_name: str = "tests.support.wire_client",
        accepts_batches: bool = False,
        relays_clients: bool = False,
    ) -> None:
        """Send Hello without waiting for the answer."""
        hello = pb.Hello(
            protocol_version=protocol_version,
            client_id=client_id,
            client_name=client_name,
            accepts_batches=accepts_batches,
            relays_clients=relays_clients,
        )
        self.send(pb.ClientFrame(hello=hello))

    def request_id(self) -> int:
        """A fresh request id."""
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    def open(
        self,
        queue_id: int,
        uri: str,
        read: bool = False,
        write: bool = False,
        options: pb.QueueOptions | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> pb.Response:
        """Open ``uri`` as ``queue_id`` and return the Response."""
        request = pb.OpenQueue(
            request_id=self.request_id(),
            queue_id=queue_id,
            uri=uri,
            read=read,
            write=write,
            options=options,
        )
        self.send(pb.ClientFrame(open_queue=request))
        return self.response(request.request_id, timeout)

    def configure(
        self, queue_id: int, options: pb.QueueOptions, timeout: float = DEFAULT_TIMEOUT
    ) -> pb.Response:
        """Configure ``queue_id`` and return the Response."""
        request = pb.ConfigureQueue(
            request_id=self.request_id(), queue_id=queue_id, options=options
        )
        self.send(pb.ClientFrame(configure_queue=request))
        return self.response(request.request_id, timeout)

    def close_queue(self, queue_id: int, timeout: float = DEFAULT_TIMEOUT) -> pb.Response:
        """Close ``queue_id`` and return the Response."""
        request = pb.CloseQueue(request_id=self.request_id(), queue_id=queue_id)
        self.send(pb.ClientFrame(close_queue=request))
        return self.response(request.request_id, timeout)

    def barrier(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Return once the server has read every frame sent before: a round trip with a
        request it answers in order (a ConfigureQueue on a queue_id nobody opens)."""
        request = pb.ConfigureQueue(request_id=self.request_id(), queue_id=BARRIER_QUEUE_ID)
        self.send(pb.ClientFrame(configure_queue=request))
        self.response(request.request_id, timeout)

    def response(self, request_id: int, timeout: float = DEFAULT_TIMEOUT) -> pb.Response:
        """The Response to ``request_id`` (other Responses are kept for later)."""
        deadline = time.monotonic() + timeout
        skipped: list[pb.ServerFrame] = []
        try:
            while True:
                frame = self.recv("response", max(deadline - time.monotonic(), 0.0))
                if frame.response.request_id == request_id:
                    response: pb.Response = frame.response
                    return response
                skipped.append(frame)
        finally:
            self._kept[:0] = skipped

    def put(self, queue_id: int, items: Iterable[PutItem], age_ms: int = 0) -> None:
        """Send one PutBatch frame of ``(guid, payload, properties)`` on ``queue_id``,
        every PUT ``age_ms`` old. GUIDs must be 16 bytes: a columnar batch cannot carry
        another size (``put_columns`` sends columns as they are)."""
        rows = list(items)
        if any(len(guid) != 16 for guid, _, _ in rows):
            raise ValueError("a PUT batch carries 16-byte GUIDs only; see put_columns")
        batch = put_batch(
            [queue_id] * len(rows),
            [guid for guid, _, _ in rows],
            [payload for _, payload, _ in rows],
            [age_ms] * len(rows),
            [(i, properties) for i, (_, _, properties) in enumerate(rows) if properties],
        )
        self.send(pb.ClientFrame(puts=batch))

    def put_columns(self, batch: pb.PutBatch) -> None:
        """Send a PutBatch as it is (columns that may disagree, for bad-input tests)."""
        self.send(pb.ClientFrame(puts=batch))

    def confirm(self, queue_id: int, guids: Sequence[bytes]) -> None:
        """Send one ConfirmBatch frame."""
        self.send(pb.ClientFrame(confirms=confirm_batch([queue_id] * len(guids), guids)))

    # -- the end --------------------------------------------------------------------

    def close(self) -> None:
        """Half-close the stream and close the channel."""
        self._outgoing.put(_END)
        self._call.cancel()
        self._channel.close()
        if self._receiver.is_alive():
            self._receiver.join(5)

    def finish(self) -> None:
        """Half-close the stream (no more frames from us), leaving it open to receive."""
        self._outgoing.put(_END)

    def __enter__(self) -> WireClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

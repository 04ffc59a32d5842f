"""A scripted broker side for driving ``SessionEngine`` with no sockets and no threads.

In the style of h11's ``ConnectionPair``: the test plays the broker. It takes
what the engine wants to send (encoded into real ``pb.ClientFrame``s by
``holdfast.sdk.frames.encode``, exactly as the shell does), looks at it, and
feeds ``pb.ServerFrame``s back with ``frame_received``. Time is a float the test
moves by hand. Callbacks (ACKs, messages, events) are run as soon as an input
returns, in the order the engine gives them, and recorded on one timeline.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from holdfast.proto import PROTOCOL_VERSION, pb
from holdfast.proto.columns import PutRow, ack_batch
from holdfast.sdk.engine import LinkState, SessionEngine
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.events import SessionEvent
from holdfast.sdk.frames import encode
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.types import Ack, AckStatus, Message, Rejection
from tests.support.columns import PushView, push_batch_of, puts_of

MAX_BATCH_BYTES = 1024 * 1024
URI = "hf://test/orders"


class Harness:
    """One engine and the scripted broker at the other end of its link."""

    def __init__(
        self,
        *,
        high_watermark_bytes: int = 64 * 1024 * 1024,
        max_disconnected_buffer_bytes: int | None = None,
        now: float = 1000.0,
        wire_pushes: bool = False,
        wire_acks: bool = False,
        retry_refusals: bool = False,
    ) -> None:
        self.engine = SessionEngine(
            client_id="client-1",
            client_name="engine tests",
            on_event=self._record_event,
            confirmer=self._confirm,
            high_watermark_bytes=high_watermark_bytes,
            max_disconnected_buffer_bytes=max_disconnected_buffer_bytes,
            wire_pushes=wire_pushes,
            wire_acks=wire_acks,
            retry_refusals=retry_refusals,
        )
        self.now = now
        self.generation = 0
        self.events: list[SessionEvent] = []
        self.acks: list[Ack] = []
        self.messages: list[Message] = []
        self.timeline: list[SessionEvent | Ack | Message] = []
        """Everything the application saw, in the order it saw it."""
        self.completions: list[tuple[int, HoldfastError | None]] = []
        self.sent: list[pb.ClientFrame] = []
        """Every frame the engine has sent so far, in order."""

    # ------------------------------------------------------------------ the application side

    def record_ack(self, ack: Ack) -> None:
        self.acks.append(ack)
        self.timeline.append(ack)

    def record_message(self, message: Message) -> None:
        self.messages.append(message)
        self.timeline.append(message)

    def _record_event(self, event: SessionEvent) -> None:
        self.events.append(event)
        self.timeline.append(event)

    def _confirm(self, message: Message, reject: Rejection | None = None) -> None:
        self.engine.confirm(message, reject)

    def run_callbacks(self) -> None:
        """Run the engine's callbacks and collect its completions (the dispatcher's job)."""
        for function, argument in self.engine.take_callbacks():
            function(argument)
        self.completions.extend(self.engine.take_completions())

    def open_queue(
        self,
        uri: str = URI,
        *,
        read: bool = False,
        write: bool = True,
        options: QueueOptions | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
    ) -> tuple[int, int]:
        """Open a queue (``on_ack`` defaults to the recorder); return (queue id, request id)."""
        record, request_id = self.engine.open_queue(
            uri,
            read=read,
            write=write,
            options=options or QueueOptions(),
            on_message=self.record_message if read else None,
            on_ack=on_ack or self.record_ack,
        )
        self.run_callbacks()
        return record.queue_id, request_id

    def open_active(self, uri: str = URI, *, read: bool = False, write: bool = True) -> int:
        """Open a queue on the live link and answer it OK; return its queue id."""
        queue_id, request_id = self.open_queue(uri, read=read, write=write)
        for frame in self.sent_frames():
            if frame.WhichOneof("frame") == "open_queue":
                assert frame.open_queue.queue_id == queue_id
                self.answer(frame.open_queue.request_id)
        assert self.outcomes(request_id) == [None]
        return queue_id

    def post(
        self,
        queue_id: int,
        payload: bytes = b"m",
        *,
        properties: Mapping[str, str] | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
        guid: uuid.UUID | None = None,
    ) -> uuid.UUID:
        guid = self.engine.post(queue_id, payload, properties, on_ack, self.now, guid)
        self.run_callbacks()
        return guid

    def state(self) -> LinkState:
        """The engine's link state (a call, so that type checkers do not pin it)."""
        return self.engine.state

    def outcomes(self, request_id: int) -> list[HoldfastError | None]:
        """Every completion of ``request_id`` so far (``[None]``: completed once, OK)."""
        return [error for rid, error in self.completions if rid == request_id]

    def statuses(self, guid: uuid.UUID) -> list[AckStatus]:
        """Every status reported for ``guid`` so far (``[SUCCESS]``: ACKed once)."""
        return [ack.status for ack in self.acks if ack.guid == guid]

    def events_of(self, kind: type[SessionEvent]) -> list[SessionEvent]:
        return [event for event in self.events if isinstance(event, kind)]

    # ------------------------------------------------------------------ the link

    def connect(self, address: str = "broker-a:7700") -> int:
        self.generation = self.engine.connection_made(address)
        self.run_callbacks()
        return self.generation

    def lose(self, reason: str = "connection reset") -> None:
        self.engine.connection_lost(self.generation, reason)
        self.run_callbacks()

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sent_frames(self) -> list[pb.ClientFrame]:
        """Take what the engine queued for the wire and encode it, as the shell's writer does."""
        frames = [
            frame for frame, _ in encode(self.engine.take_outbound(), MAX_BATCH_BYTES, self.now)
        ]
        self.sent.extend(frames)
        return frames

    # ------------------------------------------------------------------ the broker side

    def feed(self, frame: pb.ServerFrame, *, generation: int | None = None) -> None:
        """Deliver one broker frame (on the current connection unless told otherwise)."""
        self.engine.frame_received(
            self.generation if generation is None else generation, frame, self.now
        )
        self.run_callbacks()

    def answer_hello(
        self,
        *,
        window: float = 300.0,
        max_payload_bytes: int = 0,
        max_properties: int = 0,
        max_properties_bytes: int = 0,
        protocol_version: int = PROTOCOL_VERSION,
        broker_id: str = "broker-1",
    ) -> None:
        """Answer Hello, announcing a dedup window of ``window`` seconds and the limits."""
        self.feed(
            pb.ServerFrame(
                hello_reply=pb.HelloReply(
                    protocol_version=protocol_version,
                    session_id=f"session-{self.generation}",
                    dedup_window_ms=round(window * 1000),
                    max_payload_bytes=max_payload_bytes,
                    max_properties=max_properties,
                    max_properties_bytes=max_properties_bytes,
                    broker_id=broker_id,
                )
            )
        )

    def answer(self, request_id: int, status: pb.Status = pb.STATUS_OK, message: str = "") -> None:
        self.feed(
            pb.ServerFrame(
                response=pb.Response(request_id=request_id, status=status, message=message)
            )
        )

    def answer_opens(
        self, frames: Iterable[pb.ClientFrame], status: pb.Status = pb.STATUS_OK
    ) -> list[pb.OpenQueue]:
        """Answer every OpenQueue among ``frames`` with ``status``; return them."""
        opens = opens_in(frames)
        for open_queue in opens:
            self.answer(open_queue.request_id, status)
        return opens

    def establish(self, *, window: float = 300.0) -> list[pb.ClientFrame]:
        """Connect, answer Hello and every (re)open OK; return the frames sent meanwhile."""
        self.connect()
        self.answer_hello(window=window)
        frames = self.sent_frames()
        self.answer_opens(frames)
        frames += self.sent_frames()
        return frames

    def ack(self, *guids: uuid.UUID, status: pb.Status = pb.STATUS_OK, queue_id: int = 1) -> None:
        """ACK ``guids`` in one AckBatch."""
        batch = ack_batch([(queue_id, guid.bytes, status) for guid in guids])
        self.feed(pb.ServerFrame(acks=batch))

    def push(
        self,
        queue_id: int,
        payload: bytes = b"body",
        *,
        guid: uuid.UUID | None = None,
        properties: Mapping[str, str] | None = None,
        delivery_count: int = 1,
    ) -> uuid.UUID:
        """PUSH one message to ``queue_id``; return its GUID."""
        guid = guid or uuid.uuid4()
        batch = push_batch_of(
            [PushView(queue_id, guid.bytes, payload, dict(properties or {}), delivery_count)]
        )
        self.feed(pb.ServerFrame(pushes=batch))
        return guid


# ---------------------------------------------------------------------- reading frames


def kinds(frames: Iterable[pb.ClientFrame]) -> list[str]:
    """The frame kind of each frame, e.g. ``["hello", "open_queue", "puts"]``."""
    return [frame.WhichOneof("frame") or "" for frame in frames]


def opens_in(frames: Iterable[pb.ClientFrame]) -> list[pb.OpenQueue]:
    return [f.open_queue for f in frames if f.WhichOneof("frame") == "open_queue"]


def puts_in(frames: Iterable[pb.ClientFrame]) -> list[PutRow]:
    return [put for f in frames if f.WhichOneof("frame") == "puts" for put in puts_of(f.puts)]


def put_guids(frames: Iterable[pb.ClientFrame]) -> list[uuid.UUID]:
    """The GUIDs of every PUT in ``frames``, in wire order."""
    return [uuid.UUID(bytes=put.guid) for put in puts_in(frames)]


# ---------------------------------------------------------------------- scripted set-ups


def writer(h: Harness, uri: str = URI) -> int:
    """Bring the link up and open ``uri`` for writing; return its queue id."""
    h.establish()
    return h.open_active(uri)


def reconnect(h: Harness, *, window: float = 300.0) -> list[pb.ClientFrame]:
    """Connect again, answer Hello and every reopen OK; return everything sent."""
    return h.establish(window=window)


def reader(h: Harness) -> int:
    """Bring the link up and open ``URI`` for reading; return its queue id."""
    h.establish()
    return h.open_active(URI, read=True, write=False)

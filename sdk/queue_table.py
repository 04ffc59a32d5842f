"""The queue handles of a session and their open/configure/close requests.

Each handle moves through ``holdfast.sdk.state.QUEUE_TRANSITIONS``. Requests are
correlated by id; the ids the application waits on (``waiters``, ``resolves``)
are completed here, with an error or None, and handed to the shell by
``SessionEngine.take_completions``. Rule 4's "pending open and configure requests
are not failed, they are re-sent" lives in ``link_lost``; rule 6's "close is local
while disconnected" in ``close_locally`` (the session reports the queue's pending
PUTs UNKNOWN through ``on_closed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from holdfast.proto import pb
from holdfast.proto.validate import Invalid, parse_queue_uri
from holdfast.sdk.errors import HoldfastError, InvalidArgumentError, QueueNotOpenError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.state import LIVE_STATES, QueueEvent, QueueState, next_queue_state
from holdfast.sdk.statuses import invalid_error
from holdfast.sdk.types import Ack


@dataclass(eq=False, slots=True)
class QueueRecord:
    """The engine's view of one queue handle."""

    queue_id: int
    uri: str
    read: bool
    write: bool
    options: QueueOptions
    on_message: Callable[[Any], Any] | None
    """Takes each PUSH as a ``Message``, or runs of them as ``WirePushes`` in
    ``wire_pushes`` mode."""
    on_ack: Callable[[Ack], Any] | None
    for_client: str = ""
    """A proxy's: which of its clients the handle is for (``OpenQueue.for_client``)."""
    state: QueueState = QueueState.OPENING
    ever_opened: bool = False
    waiters: list[int] = field(default_factory=list)
    """Request ids that the queue's next (re)open answer completes."""
    session_end: HoldfastError | None = None
    """Set when the end of the session closed the handle: what calls on it raise (a
    ``SessionClosedError``, ``QueueHandle``), not "the queue is closed"."""

    def apply(self, event: QueueEvent) -> None:
        """Move on ``event`` (``LocalProtocolError`` if the table has no such move)."""
        self.state = next_queue_state(self.state, event)
        if self.state is QueueState.OPEN and event is QueueEvent.OPEN_OK:
            self.ever_opened = True


RequestKind = Literal["open", "configure", "close"]


@dataclass(slots=True)
class InFlight:
    """A request on the wire, and the request ids its answer completes."""

    kind: RequestKind
    queue: QueueRecord
    resolves: list[int]
    reopen: bool = False


def wire_options(options: QueueOptions) -> pb.QueueOptions:
    """A queue's options as they travel in OpenQueue and ConfigureQueue."""
    return pb.QueueOptions(
        max_unconfirmed_messages=options.max_unconfirmed_messages,
        max_unconfirmed_bytes=options.max_unconfirmed_bytes,
    )


class QueueTable:
    """Queue handles by id (in open order) and the requests in flight for them."""

    def __init__(
        self,
        send: Callable[[pb.ClientFrame], None],
        on_closed: Callable[[QueueRecord], None],
    ) -> None:
        self._send = send
        self._on_closed = on_closed
        self._queues: dict[int, QueueRecord] = {}
        self.by_id = self._queues
        """The map itself, for the hot loops (post, ACK, PUSH): no property call."""
        self._next_queue_id = 1
        self._next_request_id = 1
        self._inflight: dict[int, InFlight] = {}
        self.restoring: set[int] = set()
        """Queues whose reopen this connection still waits for (rule 4, step 1)."""
        self._completions: list[tuple[int, HoldfastError | None]] = []

    # ------------------------------------------------------------------ lookups

    def __iter__(self) -> Iterator[QueueRecord]:
        """The handles in open order (a snapshot)."""
        return iter(list(self._queues.values()))

    def get(self, queue_id: int) -> QueueRecord | None:
        """The record of a handle, if still known."""
        return self._queues.get(queue_id)

    def live(self, queue_id: int) -> QueueRecord:
        """A handle the application may still configure or close."""
        queue = self._queues.get(queue_id)
        if queue is None or queue.state not in LIVE_STATES:
            uri = queue.uri if queue is not None else f"handle {queue_id}"
            raise QueueNotOpenError(f"queue {uri} is not open")
        return queue

    @property
    def last_queue_id(self) -> int:
        """The highest handle this session has chosen (0: none); never reused, so a
        server naming a higher one (or 0) names a queue this session never opened."""
        return self._next_queue_id - 1

    def new_request_id(self) -> int:
        """A fresh request id."""
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    # ------------------------------------------------------------------ application requests

    def open(self, uri: str, record: dict[str, Any], *, connected: bool) -> tuple[QueueRecord, int]:
        """Check and register a new handle; send its open now if ``connected``, else with
        the next connection's reopens. Returns the record and the request id to wait on."""
        try:
            parse_queue_uri(uri)
        except Invalid as error:
            raise invalid_error(error) from None
        if not (record["read"] or record["write"]):
            raise InvalidArgumentError("open a queue with read=True, write=True or both")
        if record["read"] and record["on_message"] is None:
            raise InvalidArgumentError("a queue opened with read=True needs on_message")
        queue = self.add({"uri": uri, **record})
        request_id = self.new_request_id()
        if connected:
            self.send_open(queue, [request_id], reopen=False)
        else:
            queue.waiters.append(request_id)
        return queue, request_id

    def configure(self, queue_id: int, options: QueueOptions, *, connected: bool) -> int:
        """Remember new options (a reopen uses them) and send them if ``connected``."""
        queue = self.live(queue_id)
        queue.options = options
        request_id = self.new_request_id()
        if connected:
            self.send_configure(queue, request_id)
        else:
            queue.waiters.append(request_id)
        return request_id

    def close(self, queue_id: int, *, connected: bool) -> int | None:
        """Close a handle: a request id to wait on, or None if it closed locally."""
        queue = self.live(queue_id)
        if queue.state is QueueState.OPENING:
            # The broker may still open it: undo that when it answers, as for a timeout.
            self.abandon(queue)
            return None
        if not connected:
            self.close_locally(queue)
            return None
        request_id = self.new_request_id()
        self.send_close(queue, [request_id])
        return request_id

    # ------------------------------------------------------------------ requests out

    def add(self, record_args: dict[str, Any]) -> QueueRecord:
        """Register a new handle (state OPENING) under the next queue id."""
        queue = QueueRecord(queue_id=self._next_queue_id, **record_args)
        self._next_queue_id += 1
        self._queues[queue.queue_id] = queue
        return queue

    def send_open(self, queue: QueueRecord, resolves: list[int], *, reopen: bool) -> None:
        """Put an OpenQueue on the wire; its answer completes ``resolves``."""
        request_id = self.new_request_id()
        if reopen:
            queue.apply(QueueEvent.REOPEN_SENT)
        self._inflight[request_id] = InFlight("open", queue, resolves, reopen)
        self._send(
            pb.ClientFrame(
                open_queue=pb.OpenQueue(
                    request_id=request_id,
                    queue_id=queue.queue_id,
                    uri=queue.uri,
                    read=queue.read,
                    write=queue.write,
                    options=wire_options(queue.options),
                    for_client=queue.for_client,
                )
            )
        )

    def send_configure(self, queue: QueueRecord, request_id: int) -> None:
        """Put a ConfigureQueue with the queue's current options on the wire."""
        self._inflight[request_id] = InFlight("configure", queue, [request_id])
        self._send(
            pb.ClientFrame(
                configure_queue=pb.ConfigureQueue(
                    request_id=request_id,
                    queue_id=queue.queue_id,
                    options=wire_options(queue.options),
                )
            )
        )

    def send_close(self, queue: QueueRecord, resolves: list[int]) -> None:
        """Put a CloseQueue on the wire; the handle is CLOSING until it is answered."""
        request_id = self.new_request_id()
        queue.apply(QueueEvent.CLOSE_SENT)
        self._inflight[request_id] = InFlight("close", queue, resolves)
        self._send(
            pb.ClientFrame(
                close_queue=pb.CloseQueue(request_id=request_id, queue_id=queue.queue_id)
            )
        )

    def abandon(self, queue: QueueRecord) -> None:
        """The application gave up the first open of ``queue`` (still OPENING).

        Whoever waits for it is told the queue is not open; if the open is on the
        wire, the queue is closed again when the broker opens it."""
        gone = QueueNotOpenError(f"queue {queue.uri} was given up before it opened")
        self.complete(queue.waiters, gone)
        queue.waiters = []
        inflight = [r for r in self._inflight.values() if r.queue is queue]
        for request in inflight:
            self.complete(request.resolves, gone)
            request.resolves = []
        if inflight:
            queue.apply(QueueEvent.ABANDON)
        else:
            self.forget(queue)

    # ------------------------------------------------------------------ answers in

    def answered(self, request_id: int) -> InFlight | None:
        """Take the request a Response answers (None if it is not in flight)."""
        return self._inflight.pop(request_id, None)

    def opened(self, queue: QueueRecord, request: InFlight, error: HoldfastError | None) -> bool:
        """Apply the answer to an open; return True if the queue is (re)opened."""
        if queue.state is QueueState.ABANDONED:
            if error is None:  # the application gave up; undo the open
                self.send_close(queue, [])
            else:
                self.forget(queue)
            return False
        if error is not None:
            self.close_locally(queue)
            return False
        queue.apply(QueueEvent.OPEN_OK)
        return True

    # ------------------------------------------------------------------ endings

    def link_lost(self) -> None:
        """Rule 4 and 6 when the link drops: closes in flight complete locally; opens
        and configures in flight wait for the next connection's reopen."""
        self.restoring.clear()
        inflight, self._inflight = self._inflight, {}
        for request in inflight.values():
            queue = request.queue
            if request.kind == "close":
                self.close_locally(queue)
                self.complete(request.resolves, None)
            elif queue.state is QueueState.ABANDONED:
                self.forget(queue)
            else:
                queue.waiters[:0] = request.resolves
                if queue.state is QueueState.REOPENING:
                    queue.apply(QueueEvent.LINK_LOST)

    def close_locally(self, queue: QueueRecord) -> None:
        """Mark a queue closed; ``on_closed`` reports its pending PUTs (rule 6)."""
        self._on_closed(queue)
        self.forget(queue)
        self.complete(queue.waiters, QueueNotOpenError(f"queue {queue.uri} was closed"))
        queue.waiters = []

    def forget(self, queue: QueueRecord) -> None:
        """The handle is closed for good."""
        queue.apply(QueueEvent.FORGET)
        self._queues.pop(queue.queue_id, None)
        self.restoring.discard(queue.queue_id)

    def fail_first_opens(self, error: HoldfastError) -> None:
        """Fail the waiters of every queue whose first open has not completed, and
        forget those queues (a proxy said it reaches no broker). Queues that were open
        keep waiting for their reopen."""
        for queue in list(self._queues.values()):
            if queue.state is QueueState.OPENING and queue.waiters:
                self.complete(queue.waiters, error)
                queue.waiters = []
                self.forget(queue)

    def end(self, error: HoldfastError, closed: HoldfastError) -> None:
        """The session is over: every waiter fails with ``error``; every handle is
        closed, and its calls raise ``closed``."""
        for queue in list(self._queues.values()):
            self.complete(queue.waiters, error)
            queue.waiters = []
            queue.session_end = closed
            self.forget(queue)
        for request in self._inflight.values():
            self.complete(request.resolves, error)
        self._inflight.clear()

    # ------------------------------------------------------------------ completions

    def complete(self, request_ids: list[int], error: HoldfastError | None) -> None:
        """Requests the application waits on are done (``error`` None if they succeeded)."""
        self._completions.extend((rid, error) for rid in request_ids)

    def take_completions(self) -> list[tuple[int, HoldfastError | None]]:
        """Completed requests, in order."""
        done, self._completions = self._completions, []
        return done

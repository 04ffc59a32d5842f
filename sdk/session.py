"""``Session``: the synchronous, thread-safe client, a thin I/O shell around the engine.

Threads, each with one job:

- the caller's threads run the API; ``post()`` may wait here, up to 5 s, when the
  transport pushes back (rule 7), so back-pressure reaches the application;
- the connector thread connects (failing over across addresses with capped,
  jittered back-off) and reads frames from the live stream into the engine;
- gRPC's request thread pulls batched frames from ``_outbound_frames``;
- the dispatcher thread runs ACK, message and event callbacks in order.

All HA rules live in ``holdfast.sdk.engine.SessionEngine``; this module only
moves its inputs and outputs under one lock.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from holdfast.proto import pb
from holdfast.sdk.dispatch import Dispatcher
from holdfast.sdk.engine import HIGH_WATERMARK_WAIT, SessionEngine
from holdfast.sdk.errors import (
    BandwidthLimitError,
    ConfirmDroppedError,
    HoldfastError,
    InvalidArgumentError,
    RequestTimeoutError,
    RetryableTransportError,
    TerminalTransportError,
)
from holdfast.sdk.events import ConnectAttemptFailed, SessionEvent, log_event
from holdfast.sdk.failover import FailoverPolicy, parse_addresses
from holdfast.sdk.frames import encode
from holdfast.sdk.marks import CommitMark, call_commit_mark
from holdfast.sdk.options import QueueOptions, SessionOptions, default_address
from holdfast.sdk.queue import Queue
from holdfast.sdk.transport import Link, classify_rpc_error
from holdfast.sdk.types import Ack, Message

log = logging.getLogger("holdfast.sdk.session")

CLOSE_DRAIN_TIMEOUT = 2.0
"""Seconds ``close()`` lets the broker read what was sent before the stream is cancelled."""


class Session:
    """A connection to a Holdfast proxy or broker that survives its failures.

    Use it as a context manager; ``close()`` waits up to
    ``SessionOptions.close_timeout`` for outstanding ACKs. ``address`` is
    ``"host:port"`` or a comma-separated list to fail over across, in order;
    by default ``$HOLDFAST_ADDRESS`` or ``127.0.0.1:7701``. ``on_event`` receives
    typed ``SessionEvent``s on the dispatcher thread (default: they are logged).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        on_event: Callable[[SessionEvent], Any] | None = None,
        options: SessionOptions | None = None,
    ) -> None:
        self._addresses = parse_addresses(address or default_address())
        self._options = options or SessionOptions()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # flush, watermark, requests
        self._writer_wakeup = threading.Condition(self._lock)
        self._writer_idle = False
        self._dispatcher = Dispatcher("holdfast-dispatch")
        self._engine = SessionEngine(
            client_id=str(uuid.uuid4()),
            client_name=self._options.client_name,
            on_event=on_event or log_event,
            confirmer=self._confirm,
            high_watermark_bytes=self._options.high_watermark_bytes,
            max_disconnected_buffer_bytes=self._options.max_disconnected_buffer_bytes,
        )
        self._results: dict[int, HoldfastError | None] = {}
        self._waiting: set[int] = set()
        self._link: Link | None = None
        self._stopping = threading.Event()
        self._closed = False
        self._connector = threading.Thread(
            target=self._connect_loop, name="holdfast-connector", daemon=True
        )
        self._connector.start()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ public API

    @property
    def addresses(self) -> list[str]:
        """The addresses this session fails over across, in order."""
        return list(self._addresses)

    @property
    def pending_count(self) -> int:
        """PUTs posted and not yet reported to their ``on_ack``."""
        with self._lock:
            return self._engine.pending_count

    @property
    def connected(self) -> bool:
        """True while the broker has answered Hello on the current connection."""
        with self._lock:
            return self._engine.connected

    def commit_mark(
        self,
        uri: str,
        app_id: str,
        version: int | None = None,
        *,
        digest: bytes = b"",
        rows: int = 0,
        timeout: float = 30.0,
    ) -> CommitMark | None:
        """Read (``version=None``) or record the commit mark of writer ``app_id`` on queue
        ``uri``; return the mark the broker holds now (None: none yet).

        Marks never expire: a writer reads its mark before writing a version and skips a
        version already committed, however late the replay (Delta Lake's
        ``txnAppId``/``txnVersion``). Recording a version below the stored one changes
        nothing; the stored version again with another ``digest`` raises
        ``CommitMarkConflictError``. The call is idempotent and retried across this
        session's addresses until ``timeout``; it needs no open queue.
        """
        request = pb.CommitMarkRequest(queue_uri=uri, app_id=app_id)
        if version is not None:
            if version < 0:
                raise InvalidArgumentError(f"a commit mark version is >= 0, not {version}")
            request.record = True
            request.version = version
            request.digest = digest
            request.rows = rows
        return call_commit_mark(self._addresses, request, timeout)

    def open_queue(
        self,
        uri: str,
        *,
        read: bool = False,
        write: bool = False,
        on_message: Callable[[Message], Any] | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
        options: QueueOptions | None = None,
        timeout: float = 30.0,
    ) -> Queue:
        """Open ``hf://<domain>/<queue>`` and block until the broker has opened it.

        ``on_message`` is required with ``read=True``; ``on_ack`` is the default
        ACK callback for PUTs posted without one. If the link is down the open is
        sent when it comes back; ``RequestTimeoutError`` after ``timeout`` seconds.
        """
        with self._lock:
            record, request_id = self._engine.open_queue(
                uri,
                read=read,
                write=write,
                options=options or QueueOptions(),
                on_message=on_message,
                on_ack=on_ack,
            )
            self._waiting.add(request_id)
            self._after_input()
        try:
            self._wait_request(request_id, timeout, f"opening {uri}")
        except RequestTimeoutError:
            with self._lock:
                self._engine.abandon_open(record.queue_id)
                self._after_input()
            raise
        return Queue(self, record)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every PUT posted so far is reported; True if so within ``timeout``.

        "Reported" includes running its ``on_ack`` callback, so counters kept by
        callbacks are complete when this returns True.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._engine.pending_count:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(remaining)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self._dispatcher.barrier(remaining)

    def close(self, timeout: float | None = None) -> None:
        """Close the session: flush for up to ``timeout`` seconds (default
        ``SessionOptions.close_timeout``), then report what is still pending as
        ``UNKNOWN``, emit ``SessionClosed`` and stop the threads."""
        if self._closed:
            return
        self._closed = True
        self.flush(self._options.close_timeout if timeout is None else timeout)
        in_connector = threading.current_thread() is self._connector
        with self._lock:
            # The writer sends what is queued (CONFIRMs issued before close()) and
            # ends the stream; the broker reads all of it before it sees the end.
            # Cancelling instead could discard frames it had not read yet.
            self._stopping.set()
            self._writer_wakeup.notify_all()
        if not in_connector:
            self._connector.join(CLOSE_DRAIN_TIMEOUT)
        with self._lock:
            self._engine.close()
            self._after_input()
            link = self._link
        if link is not None:
            link.close()
        if not in_connector:
            self._connector.join(10)
        self._dispatcher.stop(10)

    # ------------------------------------------------------------------ used by Queue and Message

    def _post(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        guid: uuid.UUID | None,
    ) -> uuid.UUID:
        with self._lock:
            if self._engine.over_high_watermark():
                self._wait_below_high_watermark()
            guid = self._engine.post(
                queue_id, payload, properties, on_ack, time.monotonic(), guid=guid
            )
            if self._writer_idle:
                self._wake_writer()
        return guid

    def _confirm(self, message: Message) -> None:
        with self._lock:
            if self._stopping.is_set():
                # The writer may already have ended the stream: this one cannot leave.
                raise ConfirmDroppedError(
                    f"CONFIRM of {message.guid} dropped: the session is closing; "
                    "the broker will redeliver the message"
                )
            self._engine.confirm(message)
            if self._writer_idle:
                self._wake_writer()

    def _configure(self, queue_id: int, options: QueueOptions, timeout: float) -> None:
        with self._lock:
            request_id = self._engine.configure_queue(queue_id, options)
            self._waiting.add(request_id)
            self._after_input()
        self._wait_request(request_id, timeout, "configuring the queue")

    def _close_queue(self, queue_id: int, timeout: float) -> None:
        with self._lock:
            request_id = self._engine.close_queue(queue_id)
            if request_id is not None:
                self._waiting.add(request_id)
            self._after_input()
        if request_id is not None:
            self._wait_request(request_id, timeout, "closing the queue")

    # ------------------------------------------------------------------ waiting

    def _wait_below_high_watermark(self) -> None:
        """Rule 7: hold the caller up to 5 s for the transport to drain (lock held)."""
        deadline = time.monotonic() + HIGH_WATERMARK_WAIT
        while self._engine.over_high_watermark():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BandwidthLimitError(
                    f"the outbound buffer stayed over its high watermark "
                    f"({self._options.high_watermark_bytes} bytes) for "
                    f"{HIGH_WATERMARK_WAIT:.0f} s; the message was not taken"
                )
            self._changed.wait(remaining)

    def _wait_request(self, request_id: int, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while request_id not in self._results:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._waiting.discard(request_id)
                    raise RequestTimeoutError(f"{what} did not complete within {timeout} s")
                self._changed.wait(remaining)
            error = self._results.pop(request_id)
            self._waiting.discard(request_id)
        if error is not None:
            raise error

    def _wake_writer(self) -> None:
        """Wake the idle writer (lock held). It is marked busy at once, so the posts
        made before it gets the lock back do not each notify it again: a notify is
        ~0.5 us of Python, and a producer can post hundreds of times meanwhile."""
        self._writer_idle = False
        self._writer_wakeup.notify()

    def _after_input(self) -> None:
        """Move the engine's outputs to where they go (lock held)."""
        engine = self._engine
        self._dispatcher.submit(engine.take_callbacks())
        for request_id, error in engine.take_completions():
            if request_id in self._waiting:
                self._results[request_id] = error
        if self._writer_idle and engine.has_outbound:
            self._wake_writer()
        self._changed.notify_all()

    # ------------------------------------------------------------------ the connector thread

    def _connect_loop(self) -> None:
        policy = FailoverPolicy(self._addresses, self._options.reconnect)
        while not self._stopping.is_set():
            address = policy.current
            try:
                established, reason = self._run_link(address)
            except TerminalTransportError as exc:
                with self._lock:
                    self._engine.fail(exc)
                    self._after_input()
                return
            if self._stopping.is_set():
                return
            delay = policy.connection_ended(established)
            if not established:
                with self._lock:
                    self._engine.emit(ConnectAttemptFailed(address, reason, delay))
                    self._after_input()
            self._stopping.wait(delay)

    def _run_link(self, address: str) -> tuple[bool, str]:
        """Run one connection until it ends.

        Returns whether Hello was answered and why the connection ended; raises
        ``TerminalTransportError`` when reconnecting cannot help.
        """
        link = Link(address, self._options)
        with self._lock:
            if self._stopping.is_set():
                return False, "session closing"
            self._link = link
            generation = self._engine.connection_made(address)
            self._after_input()
        # A peer that accepts TCP but never answers Hello must not hold us forever.
        handshake_timer = threading.Timer(self._options.connect_timeout, link.expire)
        handshake_timer.daemon = True
        handshake_timer.start()
        established = False
        reason = "the broker ended the stream"
        try:
            for frame in link.open(self._outbound_frames(link, generation)):
                with self._lock:
                    self._engine.frame_received(generation, frame, time.monotonic())
                    if not established and self._engine.connected:
                        established = True
                        handshake_timer.cancel()
                    self._after_input()
        except RetryableTransportError as exc:
            reason = str(exc)
        except grpc.RpcError as exc:
            error = classify_rpc_error(exc)
            if isinstance(error, TerminalTransportError):
                raise error from exc
            reason = str(error)
        finally:
            handshake_timer.cancel()
            link.close()
            with self._lock:
                if not self._stopping.is_set():  # a close is not a lost connection
                    self._engine.connection_lost(generation, reason)
                self._link = None
                self._after_input()
                self._writer_wakeup.notify_all()
        if not established and link.closed_by_timer:
            reason = f"no answer to Hello within {self._options.connect_timeout} s"
        return established, reason

    def _outbound_frames(self, link: Link, generation: int) -> Iterator[pb.ClientFrame]:
        """The request iterator gRPC pulls from: batches everything queued since the last pull.

        gRPC asks for the next frame only once the previous one is sent, so
        while it waits on flow control PUTs pile up in the engine, count against
        the high watermark, and leave together in the next batch.
        """
        engine = self._engine
        max_batch = self._options.max_batch_bytes
        while True:
            with self._lock:
                while not (engine.has_outbound or link.closed or self._stopping.is_set()):
                    self._writer_idle = True
                    self._writer_wakeup.wait()
                self._writer_idle = False
                if link.closed or engine.generation != generation or not engine.has_outbound:
                    return  # the end of the request stream: a half-close when stopping
                items = engine.take_outbound()
            for frame, nbytes in encode(items, max_batch):
                yield frame
                with self._lock:
                    engine.transport_drained(nbytes)
                    self._changed.notify_all()


__all__ = ["Session"]

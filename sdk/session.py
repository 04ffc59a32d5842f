"""``Session``: the synchronous, thread-safe client, a thin front-end on the threaded driver.

The caller's threads run the API; ``post()`` may wait here, up to 5 s, when the
transport pushes back (rule 7), so back-pressure reaches the application.
Connections, failover, reading, writing and timers are
``holdfast.sdk.driver.threaded.ThreadDriver``'s; callbacks run on the dispatcher
thread; every HA rule lives in ``holdfast.sdk.engine.SessionEngine``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from holdfast.proto import pb
from holdfast.sdk import instrument, metrics, tracing
from holdfast.sdk.dispatch import Dispatcher, lock_timeout
from holdfast.sdk.driver.threaded import ThreadDriver
from holdfast.sdk.engine import SessionEngine
from holdfast.sdk.errors import InvalidArgumentError, RequestTimeoutError
from holdfast.sdk.events import SessionEvent, log_event
from holdfast.sdk.failover import parse_addresses
from holdfast.sdk.handlers import reject_on_failure
from holdfast.sdk.inbox import Inbox, Inboxes
from holdfast.sdk.interrupts import interrupts_deferred
from holdfast.sdk.marks import CommitMark, call_commit_mark
from holdfast.sdk.options import QueueOptions, SessionOptions, default_address
from holdfast.sdk.producer import check_callback
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc.api import RequestReply
from holdfast.sdk.stats import SessionStats
from holdfast.sdk.transports.base import SyncTransport
from holdfast.sdk.transports.grpc_sync import GrpcSyncTransport
from holdfast.sdk.types import Ack, Message, Rejection

INTERRUPTED_CLOSE_TIMEOUT = 1.0
"""Seconds a session closed by Ctrl-C (``KeyboardInterrupt``) still waits for ACKs."""


class Session(RequestReply):
    """A connection to a Holdfast proxy or broker that survives its failures.

    Use it as a context manager; ``close()`` waits up to
    ``SessionOptions.close_timeout`` for outstanding ACKs. ``address`` is
    ``"host:port"`` or a comma-separated list to fail over across, in order;
    by default ``$HOLDFAST_ADDRESS`` or ``127.0.0.1:7701``. ``on_event`` receives
    typed ``SessionEvent``s on the dispatcher thread (default: they are logged).
    ``transport`` replaces gRPC (for example with an in-memory transport in tests).
    Request/reply (``request``, ``request_async``) comes from ``RequestReply``.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        on_event: Callable[[SessionEvent], Any] | None = None,
        options: SessionOptions | None = None,
        transport: SyncTransport | None = None,
    ) -> None:
        check_callback("on_event", on_event)
        self._addresses = parse_addresses(address or default_address())
        self._options = options or SessionOptions()
        self._dispatcher = Dispatcher("holdfast-dispatch")
        self._inboxes = Inboxes()
        application_on_event = on_event or log_event

        def route_event(event: SessionEvent) -> None:
            self._inboxes.on_event(event)  # message iterators first: they may end now
            self._rpc_event(event)
            application_on_event(event)

        self._engine = SessionEngine(
            client_id=str(uuid.uuid4()),
            client_name=self._options.client_name,
            on_event=route_event,
            confirmer=self._confirm,
            high_watermark_bytes=self._options.high_watermark_bytes,
            max_disconnected_buffer_bytes=self._options.max_disconnected_buffer_bytes,
        )
        self._driver = ThreadDriver(
            self._engine,
            self._addresses,
            self._options,
            transport or GrpcSyncTransport(self._options),
            self._dispatcher,
        )
        self._lock = self._driver.lock
        self._closed = False
        self._telemetry = self._options.telemetry and tracing.AVAILABLE
        if self._telemetry:
            metrics.watch(self)
        self._driver.start()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: object,
    ) -> None:
        # Ctrl-C means "stop now": no 30 s wait for ACKs; what is pending is reported.
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        self.close(timeout=INTERRUPTED_CLOSE_TIMEOUT if interrupted else None)

    # ------------------------------------------------------------------ public API

    @property
    def addresses(self) -> list[str]:
        """The addresses this session fails over across, in order."""
        return list(self._addresses)

    @property
    def client_id(self) -> str:
        """The id this session announces to the broker (``holdfast.client.id`` in its
        OpenTelemetry metrics)."""
        return self._engine.client_id

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

    def stats(self) -> SessionStats:
        """A snapshot of this session's client counters (``holdfast.sdk.SessionStats``):
        buffered PUTs and bytes, ACKs by status, reconnects, retransmits, posts that
        waited, messages delivered, confirmed and rejected. Thread-safe and cheap."""
        with self._lock:
            return self._engine.stats()

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
        return call_commit_mark(self._addresses, request, timeout, self._options)

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

        With ``read=True``, ``on_message`` is called with each message on the SDK's
        dispatcher thread; a message it raises on is rejected with requeue after a
        back-off (``QueueOptions.retry_delay``), never left unconfirmed. Without
        ``on_message``, read the queue in your own thread with ``queue.messages()``.
        ``on_ack`` is the default ACK callback for PUTs posted without one. If the
        link is down the open is sent when it comes back; ``RequestTimeoutError``
        after ``timeout`` seconds.
        """
        check_callback("on_message", on_message)
        check_callback("on_ack", on_ack)
        driver = self._driver
        options = options or QueueOptions()
        inbox: Inbox | None = None
        handler: Callable[[Message], Any] | None = None
        if on_message is not None:
            if self._telemetry:
                on_message = instrument.traced_handler(on_message)
            handler = reject_on_failure(on_message, options)
        elif read:
            inbox = Inbox(traced=self._telemetry)
            handler = inbox.put
        with self._lock:
            record, request_id = self._engine.open_queue(
                uri,
                read=read,
                write=write,
                options=options,
                on_message=handler,
                on_ack=on_ack,
            )
            if inbox is not None:
                self._inboxes.add(inbox, record)
            driver.expect(request_id)
            driver.after_input()
        try:
            driver.wait_request(request_id, timeout, f"opening {uri}")
        except RequestTimeoutError:
            with self._lock:
                self._engine.abandon_open(record.queue_id)
                driver.after_input()
            raise
        return Queue(self, record, inbox)

    def has_workers(self, uri: str, timeout: float = 10.0) -> bool:
        """True if ``uri`` has a live consumer now (request/reply service discovery).

        Answered by the broker from the consumers attached to the queue (through a
        proxy as well); asked again after a reconnect. ``RequestTimeoutError`` after
        ``timeout`` seconds without an answer.
        """
        driver = self._driver
        with self._lock:
            request_id = self._engine.count_consumers(uri)
            driver.expect(request_id)
            driver.after_input()
        try:
            driver.wait_request(request_id, timeout, f"asking for the consumers of {uri}")
        finally:
            with self._lock:
                count = self._engine.queries.take_answer(request_id)
        return bool(count)

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
                self._driver.changed.wait(lock_timeout(remaining))
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self._dispatcher.barrier(remaining)

    def close(self, timeout: float | None = None) -> None:
        """Close the session: flush for up to ``timeout`` seconds (default
        ``SessionOptions.close_timeout``); send what is queued (the CONFIRMs issued
        before this call) and end the stream, waiting up to 2 s more for the broker to
        read it; then report what is still pending as ``UNKNOWN``, emit
        ``SessionClosed`` and stop the threads."""
        if self._closed:
            return
        self._closed = True
        interrupted: KeyboardInterrupt | None = None
        try:
            self._close_rpc()
            self.flush(self._options.close_timeout if timeout is None else timeout)
        except KeyboardInterrupt as exc:
            interrupted = exc  # a (second) Ctrl-C: stop waiting, still report every PUT
        metrics.unwatch(self)
        with interrupts_deferred() as deferred:
            self._driver.stop()  # reports what is still pending UNKNOWN
            self._dispatcher.stop(10)  # runs those on_ack callbacks
            self._inboxes.end_all()  # SessionClosed did, unless the dispatcher was stuck
        interrupted = interrupted or deferred.interrupt
        if interrupted is not None:
            raise interrupted

    # ------------------------------------------------------------------ used by Queue and Message

    def _post(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        guid: uuid.UUID | None,
    ) -> uuid.UUID:
        if self._telemetry and tracing.configured():
            span, properties, on_ack = instrument.prepare_post(
                self._engine.queue(queue_id),
                properties,
                on_ack,
                guid is not None,
                self._engine.limits,
            )
            if span is not None:
                try:
                    return self._post_now(queue_id, payload, properties, on_ack, guid)
                except BaseException as error:
                    tracing.fail(span, error)
                    raise
        return self._post_now(queue_id, payload, properties, on_ack, guid)

    def _post_now(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        guid: uuid.UUID | None,
    ) -> uuid.UUID:
        driver = self._driver
        engine = self._engine
        with self._lock:
            now = time.monotonic()
            if engine.admit_post(now, now, queue_id):
                now = driver.wait_admission(now, queue_id)
            if guid is None:
                guid = engine.buffer(queue_id, payload, properties, on_ack, now, None)
            else:
                guid = engine.post(queue_id, payload, properties, on_ack, now, guid=guid)
            if driver.writer_idle:
                driver.wake_writer()
        return guid

    def _post_many(
        self,
        queue_id: int,
        payloads: Sequence[bytes],
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
    ) -> list[uuid.UUID]:
        if self._telemetry and tracing.configured():  # a span per message, as post() makes
            return [self._post(queue_id, p, properties, on_ack, None) for p in payloads]
        driver = self._driver
        with self._lock:  # once for the batch: the lock, the admission, the wake-up
            now = time.monotonic()
            if self._engine.admit_post(now, now, queue_id):
                now = driver.wait_admission(now, queue_id)
            guids = self._engine.post_many(queue_id, payloads, properties, on_ack, now)
            if driver.writer_idle:
                driver.wake_writer()
        return guids

    def _confirm(self, message: Message, reject: Rejection | None = None) -> None:
        if self._telemetry and tracing.configured():
            with instrument.settling(message, reject is not None):
                self._confirm_now(message, reject)
        else:
            self._confirm_now(message, reject)

    def _confirm_now(self, message: Message, reject: Rejection | None) -> None:
        driver = self._driver
        with self._lock:
            self._engine.confirm(message, reject)
            if driver.writer_idle:
                driver.wake_writer()

    def _configure(self, queue_id: int, options: QueueOptions, timeout: float) -> None:
        with self._lock:
            request_id = self._engine.configure_queue(queue_id, options)
            self._driver.expect(request_id)
            self._driver.after_input()
        self._driver.wait_request(request_id, timeout, "configuring the queue")

    def _close_queue(self, queue_id: int, timeout: float) -> None:
        with self._lock:
            request_id = self._engine.close_queue(queue_id)
            if request_id is not None:
                self._driver.expect(request_id)
            self._driver.after_input()
        if request_id is not None:
            self._driver.wait_request(request_id, timeout, "closing the queue")


__all__ = ["Session"]

"""The service side of request/reply: ``Worker(session, uri, handler, concurrency=1)``.

A worker consumes the service queue with at most ``concurrency`` requests
unconfirmed, runs ``handler`` on its own threads, posts the reply under the
GUID derived from the request GUID, and confirms the request only once the
broker has ACKed the reply. So a worker that dies at any point leaves the
request to be redelivered, and a second run posts the same reply GUID, which
the broker's dedup absorbs: one reply per call.

Idempotent service (ZeroMQ guide, chapter 4): replies are kept by request GUID
for ``WorkerOptions.reply_window`` seconds; a redelivered request whose reply was
already produced (its CONFIRM was lost with a connection) is answered from the
kept reply without running the handler again. A redelivery that arrives while
the handler still runs joins that run.

Liveness (Halibut): while a handler runs, the worker heartbeats the call on the
caller's reply queue, naming its control queue, where the caller sends a cancel;
and it asks the broker whether the caller's reply queue still has its consumer
(``Session.has_workers``): a caller gone for ``caller_grace`` seconds cancels the
call. Either way ``request.cancelled`` is set and no reply is posted.

Pickup timeout: a request whose ``x-rpc-expires`` has passed (wall clock) is not
run; the caller gets an error reply, dead-letter reason ``expired``.

Durable requests (``Session.request_durable``) are run the same way, without
heartbeats or caller checks; their reply is posted with the broker's pickup TTL set
to the time left of the request's keep time (``wire.kept_reply``).

Modules: ``jobs`` (one delivery and its answers), ``liveness`` (heartbeats and
caller checks), ``threads`` (the handler threads).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from holdfast.proto.uri import parse_queue_uri
from holdfast.sdk import tracing
from holdfast.sdk.errors import HoldfastError, InvalidArgumentError, RequestTimeoutError
from holdfast.sdk.instrument import Untraced
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import chunks, wire
from holdfast.sdk.rpc import spans as rpc_spans
from holdfast.sdk.rpc import streams as streaming
from holdfast.sdk.rpc.jobs import (
    Answer,
    Job,
    confirm,
    dead_letter,
    handler_error,
    log_reply_ack,
)
from holdfast.sdk.rpc.liveness import Beater
from holdfast.sdk.rpc.options import WorkerOptions
from holdfast.sdk.rpc.replies import ReplyMemory
from holdfast.sdk.rpc.threads import HandlerThreads
from holdfast.sdk.rpc.values import Request, StreamingReply
from holdfast.sdk.types import Ack, AckStatus, Message

if TYPE_CHECKING:
    from holdfast.sdk.session import Session

log = logging.getLogger("holdfast.sdk.rpc.worker")

HandlerResult = bytes | tuple[bytes, Mapping[str, str]] | StreamingReply
Handler = Callable[[Request], HandlerResult]

MAX_REPLY_HANDLES = 1024
"""Write handles to callers' reply queues kept open (least recently used closed)."""


class Worker:
    """Serves requests posted to ``uri`` with ``handler``; a context manager.

    ``handler(request)`` returns bytes or ``(bytes, properties)``; an exception
    (``SystemExit`` and ``KeyboardInterrupt`` too: the thread serves on) becomes an
    error reply the caller receives as ``RemoteHandlerError``.
    """

    def __init__(
        self,
        session: Session,
        uri: str,
        handler: Handler,
        concurrency: int = 1,
        *,
        options: WorkerOptions | None = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgumentError("concurrency must be >= 1")
        try:
            self._domain = domain = parse_queue_uri(uri).domain
        except ValueError as error:
            raise InvalidArgumentError(str(error)[:300]) from None
        self.uri = uri
        self.options = options or WorkerOptions()
        self._session = session
        self._traced = session._telemetry
        self._handler = handler
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running: dict[bytes, Job] = {}
        self._replies: ReplyMemory[Answer] = ReplyMemory(
            self.options.max_replies, self.options.reply_window
        )
        self._handles: OrderedDict[str, Queue] = OrderedDict()
        self._posting: dict[bytes, list[Job]] = {}
        """Replies posted and not yet ACKed, by request GUID, with the deliveries
        they answer."""
        self._stopping = threading.Event()
        self.handler_runs = 0
        """How many times the handler was started (for tests and metrics)."""
        self.replies_replayed = 0
        """Redelivered requests answered from a kept reply, without the handler."""
        self._executor = HandlerThreads(concurrency, "holdfast-worker")
        self.control_uri = f"hf://{domain}/rpc-worker-{uuid.uuid4().hex}"
        """Where callers send cancels for the requests this worker runs."""
        self._control = session.open_queue(
            self.control_uri, read=True, on_message=Untraced(self._on_control)
        )
        self._beater = Beater(
            session,
            self.options,
            self.control_uri,
            self._running_jobs,
            self._reply_queue,
            self._stopping,
        )
        self._beater.start()
        self._service = session.open_queue(
            uri,
            read=True,
            on_message=self._on_request,
            options=QueueOptions(
                max_unconfirmed_messages=concurrency + self.options.prefetch(concurrency)
            ),
        )

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, let running handlers finish (up to ``timeout``,
        default ``WorkerOptions.stop_timeout``), then close the queues. Requests
        not answered by then are redelivered to other workers."""
        if self._stopping.is_set():
            return
        wait = self.options.stop_timeout if timeout is None else timeout
        with contextlib.suppress(HoldfastError):
            self._service.configure(QueueOptions(max_unconfirmed_messages=0), timeout=wait)
        deadline = time.monotonic() + wait
        with self._lock:
            while self._running and (remaining := deadline - time.monotonic()) > 0:
                self._idle.wait(remaining)
            for job in self._running.values():
                job.request.cancelled.set()
        self._stopping.set()
        self._beater.join(5)
        # A handler that ignores its cancel is left behind, not waited for forever:
        # its request goes back to the queue when the queue closes.
        self._executor.shutdown(wait=not self._running)
        for queue in (self._service, self._control, *self._handles.values()):
            with contextlib.suppress(HoldfastError):
                queue.close(timeout=5)

    # ------------------------------------------------------------ requests (dispatcher thread)

    def _on_request(self, message: Message) -> None:
        try:
            header = wire.parse_request(message.properties)
            wire.check_reply_to(header, self._domain, message.guid)  # no confused deputy
        except ValueError as error:
            log.warning("dropping request %s: %s", message.guid, str(error)[:300])
            confirm(message)
            return
        guid = message.guid.bytes
        with self._lock:
            job = self._running.get(guid)
            if job is not None:
                job.message = message  # a redelivery joins the run; this one is confirmed
                return
            stored = self._replies.get(guid)
            if stored is None:
                # Pickup is the first delivery: a redelivery was picked up before.
                expired = message.delivery_count == 1 and 0 < header.expires_ms < wire.wall_ms()
                props = message.properties
                request = Request(
                    message.payload,
                    wire.user_properties(props),
                    message.guid,
                    props.get(wire.KEY),
                    message.delivery_count,
                )
                if chunks.NAMES in props:
                    count, cancelled = message.delivery_count, request.cancelled.is_set
                    request.streams = streaming.readers(
                        self._session, self._domain, message.guid, props, count, cancelled
                    )
                job = Job(request, message, header.reply_to, time.monotonic(), header.keep_until_ms)
                job.next_beat = job.started + self.options.first_beat_after
                if expired:
                    job.answer = dead_letter(message.guid, "expired")
                else:
                    self._running[guid] = job
            else:
                self.replies_replayed += 1
        if job is None:  # answered before: the kept reply, without running the handler
            job = Job(
                Request(b"", {}, message.guid), message, header.reply_to, 0.0, header.keep_until_ms
            )
            job.answer = stored
        # closing: left unconfirmed, redelivered elsewhere
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self._process, job)

    # ------------------------------------------------------------------ the handler threads

    def _process(self, job: Job) -> None:
        guid = job.request.guid
        while job.queue is None:
            try:
                job.queue = self._reply_queue(job.reply_to)
            except RequestTimeoutError as error:  # the link is down: try again
                log.warning("cannot open reply queue %s yet: %s", job.reply_to[:200], error)
                if self._stopping.wait(1.0):
                    self._forget(job)
                    return  # unconfirmed: the queue's close returns it for redelivery
            except HoldfastError as error:  # refused: nobody could get a reply
                log.error(
                    "dropping request %s: reply queue %s: %s", guid, job.reply_to[:200], error
                )
                self._forget(job)
                confirm(job.message)
                return
        if job.answer is None:
            if job.request.cancelled.is_set():  # cancelled while it waited for a thread
                self._forget(job)
                confirm(job.message)
                return
            job.answer = self._run(job)
            with self._lock:
                self._running.pop(guid.bytes, None)
                if not job.request.cancelled.is_set():
                    self._replies[guid.bytes] = job.answer
                self._idle.notify_all()
            if job.request.cancelled.is_set():
                confirm(job.message)  # nobody waits for this reply
                return
        self._post_answer(job)

    def _run(self, job: Job) -> Answer:
        guid = job.request.guid
        with self._lock:
            self.handler_runs += 1
        span = rpc_spans.start_serve(self.uri, job.message) if self._traced else None
        try:
            try:
                with tracing.current(span):
                    result = self._handler(job.request)
            finally:
                streaming.close_all(job.request.streams)
            if isinstance(result, StreamingReply):
                headers = chunks.streaming_reply_properties(guid, result.properties, result.streams)
                answer = (wire.payload_bytes(result.payload), headers)
                streaming.start_senders(
                    self._session,
                    parse_queue_uri(job.reply_to).domain,
                    wire.reply_guid(guid),
                    result.streams,
                    self._stopping.is_set,
                    lambda error: log.warning("reply stream of %s failed: %s", guid, error),
                    chunks.REPLY_CREDIT_TIMEOUT,
                )
            elif isinstance(result, tuple):
                payload, props = result
                answer = (wire.payload_bytes(payload), wire.reply_properties(guid, _user(props)))
            else:
                answer = (wire.payload_bytes(result), wire.reply_properties(guid, {}))
        except BaseException as error:  # the handler's failure is the caller's to see
            # SystemExit too (no signal raises one here, off the main thread): else it
            # ended this thread, the call unanswered and the worker a slot short for good.
            log.debug("handler raised for %s", guid, exc_info=True)
            answer = handler_error(guid, error)
            rpc_spans.end_serve(span, answer[1], error)
            return answer
        rpc_spans.end_serve(span, answer[1])
        return answer

    def _post_answer(self, job: Job) -> None:
        """Post the reply; confirm the request once the broker has it. A reply whose
        GUID is already on its way (a redelivery answered meanwhile) is not posted
        again: this delivery is confirmed with it."""
        assert job.queue is not None and job.answer is not None
        key = job.request.guid.bytes
        with self._lock:
            waiting = self._posting.get(key)
            if waiting is not None:
                waiting.append(job)
                return
            self._posting[key] = [job]
        payload, properties = job.answer
        if job.durable:
            kept = wire.kept_reply(properties, job.keep_until_ms)
            if kept is None:  # past its keep time: nobody may fetch it any more
                with self._lock:
                    jobs = self._posting.pop(key, [])
                for each in jobs:
                    confirm(each.message)
                return
            properties = kept
        else:  # unread past its call's deadline, it would stay in the broker for good
            properties = wire.expiring_reply(properties, job.message.properties)
        try:
            with tracing.suppressed():  # the serve span covers the reply
                job.queue.post(
                    payload,
                    properties,
                    lambda ack: self._on_reply_ack(key, ack),
                    guid=wire.reply_guid(job.request.guid),
                )
        except HoldfastError as error:  # e.g. a reply over the broker's limits
            with self._lock:
                jobs = self._posting.pop(key, [])
            if properties.get(wire.KIND) == wire.FAILURE:
                log.error("cannot post the error reply to %s: %s", job.request.guid, error)
                for each in jobs:
                    confirm(each.message)
                return
            answer = handler_error(job.request.guid, error)
            with self._lock:
                self._replies[key] = answer
            for each in jobs:
                each.answer = answer
                self._post_answer(each)

    def _on_reply_ack(self, key: bytes, ack: Ack) -> None:
        with self._lock:
            jobs = self._posting.pop(key, [])
        if ack.status is AckStatus.UNKNOWN and not self._stopping.is_set():
            # It may not be in the queue: post it again under the same GUID (dedup).
            for job in jobs:
                with contextlib.suppress(RuntimeError):
                    self._executor.submit(self._post_answer, job)
            return
        log_reply_ack(key, ack)
        for job in jobs:
            confirm(job.message)

    def _reply_queue(self, uri: str) -> Queue:
        with self._lock:
            queue = self._handles.get(uri)
            if queue is not None and queue.is_open:
                self._handles.move_to_end(uri)
                return queue
        queue = self._session.open_queue(uri, write=True)
        evicted: list[Queue] = []
        with self._lock:
            self._handles[uri] = queue
            while len(self._handles) > MAX_REPLY_HANDLES:
                evicted.append(self._handles.popitem(last=False)[1])
        for old in evicted:
            with contextlib.suppress(HoldfastError):
                old.close(timeout=5)
        return queue

    def _running_jobs(self) -> list[Job]:
        with self._lock:
            return list(self._running.values())

    def _forget(self, job: Job) -> None:
        with self._lock:
            self._running.pop(job.request.guid.bytes, None)
            self._idle.notify_all()

    # ------------------------------------------------------------------ cancels and heartbeats

    def _on_control(self, message: Message) -> None:
        key = wire.request_key(message.properties)
        if message.properties.get(wire.KIND) == wire.CANCEL and key is not None:
            with self._lock:
                job = self._running.get(key)
            if job is not None:
                job.request.cancelled.set()
        confirm(message)


def _user(properties: Mapping[str, str]) -> dict[str, str]:
    return wire.check_user_properties(properties)

"""``Worker`` of the asyncio API: serves request/reply calls on the event loop.

::

    async def handle(request: Request) -> bytes:
        return b"echo:" + request.payload

    async with Session(address) as session, Worker(session, "hf://demo/echo", handle):
        ...

The same worker rules as the threaded ``holdfast.sdk.Worker`` (``holdfast.sdk.rpc``):
at most ``concurrency`` handlers run at once (``concurrency + extra_requests``
requests held), the reply is posted under the GUID derived from the request GUID and
the request confirmed only once the broker ACKed it, replies are kept by request GUID
to answer a redelivery without running the handler again, running calls are
heartbeated, and a cancel (or a caller gone for ``caller_grace``) sets
``request.cancelled`` and cancels the handler's task. The handler is a coroutine
function, or a plain function run in the loop's default executor. A request's data
streams are ``request.streams[name]``, ``holdfast.sdk.aio.streams.AsyncStreamReader``
objects (read them in a coroutine handler); a handler may answer with a
``StreamingReply`` whose streams are binary file-like objects or async iterables of
bytes, sent by tasks of the worker (``close`` gives them ``stop_timeout`` to finish).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from holdfast.sdk import tracing
from holdfast.sdk.aio import handling
from holdfast.sdk.aio import streams as streaming
from holdfast.sdk.aio.slots import Slots
from holdfast.sdk.errors import HoldfastError, InvalidArgumentError
from holdfast.sdk.instrument import Untraced
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.rpc import calls, chunks, wire
from holdfast.sdk.rpc import spans as rpc_spans
from holdfast.sdk.rpc.jobs import (
    Answer,
    Job,
    confirm,
    dead_letter,
    handler_error,
    log_reply_ack,
)
from holdfast.sdk.rpc.options import WorkerOptions
from holdfast.sdk.rpc.replies import ReplyMemory
from holdfast.sdk.rpc.values import Request, StreamingReply
from holdfast.sdk.types import Ack, AckStatus, Message

if TYPE_CHECKING:
    from holdfast.sdk.aio.queue import Queue
    from holdfast.sdk.aio.session import Session

log = logging.getLogger("holdfast.sdk.rpc.worker")

HandlerResult = bytes | tuple[bytes, Mapping[str, str]] | StreamingReply
AsyncHandler = Callable[[Request], Awaitable[HandlerResult] | HandlerResult]


class Worker:
    """Serves requests posted to ``uri`` with ``handler``; ``async with`` it (or
    ``await worker.start()`` and ``await worker.close()``)."""

    def __init__(
        self,
        session: Session,
        uri: str,
        handler: AsyncHandler,
        concurrency: int = 1,
        *,
        options: WorkerOptions | None = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgumentError("concurrency must be >= 1")
        domain = self._domain = calls.domain_of(uri)
        self.uri = uri
        self.options = options or WorkerOptions()
        self._session = session
        self._traced = session._telemetry
        self._handler = handler
        self._coroutine = inspect.iscoroutinefunction(handler)
        self._concurrency = concurrency
        self._slots = Slots(concurrency)
        self._running: dict[bytes, Job] = {}
        self._tasks: dict[bytes, asyncio.Task[Any]] = {}
        """The handler task of each running call (cancelled with the call)."""
        self._jobs: set[asyncio.Task[None]] = set()
        self._replies = ReplyMemory[Answer](self.options.max_replies, self.options.reply_window)
        self._handles: dict[str, Queue] = {}
        self._posting: dict[bytes, list[Job]] = {}
        self._absent_since: dict[str, float] = {}
        self._stopping = False
        self.handler_runs = 0
        """How many times the handler was started (for tests and metrics)."""
        self.replies_replayed = 0
        """Redelivered requests answered from a kept reply, without the handler."""
        self.control_uri = f"hf://{domain}/rpc-worker-{uuid.uuid4().hex}"
        """Where callers send cancels for the requests this worker runs."""
        self._control: Queue | None = None
        self._service: Queue | None = None
        self._beater: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop  # set by start(), before any request

    async def start(self) -> Worker:
        """Open the control and service queues; requests flow from now on."""
        self._control = await self._session.open_queue(
            self.control_uri, read=True, on_message=Untraced(self._on_control)
        )
        self._loop = asyncio.get_running_loop()  # asked once: a getpid() call each on 3.11
        self._beater = self._loop.create_task(self._beat_loop())
        limit = self._concurrency + self.options.prefetch(self._concurrency)
        self._service = await self._session.open_queue(
            self.uri,
            read=True,
            on_message=self._on_request,
            options=QueueOptions(max_unconfirmed_messages=limit),
        )
        return self

    async def __aenter__(self) -> Worker:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, let running handlers finish (up to ``timeout``,
        default ``WorkerOptions.stop_timeout``), cancel the rest, close the queues.
        Requests not answered are redelivered to other workers."""
        if self._stopping:
            return
        wait = self.options.stop_timeout if timeout is None else timeout
        if self._service is not None:
            with contextlib.suppress(HoldfastError, TimeoutError):
                await self._service.configure(QueueOptions(max_unconfirmed_messages=0), wait)
        if self._jobs:
            await asyncio.wait(list(self._jobs), timeout=wait)
        self._stopping = True
        for job in self._running.values():
            job.request.cancelled.set()
        for task in (*self._tasks.values(), *self._jobs, self._beater):
            if task is not None:
                task.cancel()
        for queue in (self._service, self._control, *self._handles.values()):
            if queue is not None and queue.is_open:
                with contextlib.suppress(HoldfastError):
                    await queue.close(timeout=5)

    # ------------------------------------------------------------------ requests

    def _on_request(self, message: Message) -> None:
        if self._stopping:
            return  # left unconfirmed: redelivered elsewhere when the queue closes
        try:
            header = wire.parse_request(message.properties)
            wire.check_reply_to(header, self._domain, message.guid)  # no confused deputy
        except ValueError as error:
            log.warning("dropping request %s: %s", message.guid, str(error)[:300])
            confirm(message)
            return
        guid = message.guid.bytes
        job = self._running.get(guid)
        if job is not None:
            job.message = message  # a redelivery joins the run; this one is confirmed
            return
        stored = self._replies.get(guid)
        props = message.properties
        request = Request(
            message.payload,
            wire.user_properties(props),
            message.guid,
            props.get(wire.KEY),
            message.delivery_count,
        )
        if chunks.NAMES in props:
            request.streams = streaming.readers(
                self._session, self._domain, message.guid, props, message.delivery_count
            )
        job = Job(request, message, header.reply_to, time.monotonic(), header.keep_until_ms)
        job.next_beat = job.started + self.options.first_beat_after
        if stored is not None:
            self.replies_replayed += 1
            job.answer = stored
        elif message.delivery_count == 1 and 0 < header.expires_ms < wire.wall_ms():
            job.answer = dead_letter(message.guid, "expired")
        else:
            self._running[guid] = job
        self._keep(self._loop.create_task(self._process(job)))

    async def _process(self, job: Job) -> None:
        guid = job.request.guid.bytes
        try:
            if job.answer is None:
                slots = self._slots
                if not slots.take_now():
                    await slots.take()
                try:
                    if not job.request.cancelled.is_set():
                        job.answer = await self._run(job)
                finally:
                    slots.give()
                    self._running.pop(guid, None)
                if job.request.cancelled.is_set() or job.answer is None:
                    confirm(job.message)  # nobody waits for this reply
                    return
                self._replies[guid] = job.answer
            await self._post_answer(job)
        except asyncio.CancelledError:
            if job.request.cancelled.is_set() and not self._stopping:  # its caller's, late
                for each in {job, *self._posting.pop(guid, [])}:
                    confirm(each.message)
            raise  # else the worker is closing: unconfirmed, the request goes back
        except BaseException as error:
            await self._failed(job, error)

    async def _failed(self, job: Job, error: BaseException) -> None:
        """A failure that reached ``_process``: answered as a handler error if it came
        before the reply (a ``GeneratorExit`` from a future the handler awaited is thrown
        into this frame, past ``_run``), else logged and the request confirmed. Left to end
        the task, it held the request unconfirmed (one of the broker's window for good),
        its slot and, its reply GUID in ``_posting``, its redeliveries."""
        guid = job.request.guid
        if job.answer is None and not job.request.cancelled.is_set():
            log.debug("handler raised for %s", guid, exc_info=error)
            job.answer = self._replies[guid.bytes] = handler_error(guid, error)
            try:
                await self._post_answer(job)
                return
            except Exception as again:
                error = again
        log.error("request %s failed in the worker: confirmed unanswered", guid, exc_info=error)
        for each in {job, *self._posting.pop(guid.bytes, [])}:
            confirm(each.message)

    def _keep(self, task: asyncio.Task[Any]) -> None:
        """Hold ``task`` until it ends (``close`` waits for, then cancels, the rest)."""
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _run(self, job: Job) -> Answer | None:
        """Run the handler in this task (a cancel cancels it: ``_cancel``); its reply,
        its error reply (whatever it raised: ``holdfast.sdk.aio.handling``), or None if
        its caller cancelled."""
        guid = job.request.guid
        self.handler_runs += 1
        task = asyncio.current_task(self._loop)
        assert task is not None
        self._tasks[guid.bytes] = task
        span = rpc_spans.start_serve(self.uri, job.message) if self._traced else None
        try:
            with tracing.current(span):
                result = await handling.call(self._handler, self._coroutine, job.request)
            answer = handling.answer(self._session, job, result, self._keep)
        except BaseException as error:  # the handler's failure is the caller's to see
            if handling.cancelled_from_outside(error, task):
                tracing.fail(span, error)
                if self._stopping or not job.request.cancelled.is_set():
                    raise  # the worker is closing: the request goes back to the queue
                task.uncancel()
                return None  # cancelled by its caller
            log.debug("handler raised for %s", guid, exc_info=error)
            answer = handler_error(guid, error)
            rpc_spans.end_serve(span, answer[1], error)
            return answer
        finally:
            self._tasks.pop(guid.bytes, None)
            if job.request.streams:
                await streaming.close_all(job.request.streams)
        rpc_spans.end_serve(span, answer[1])
        return answer

    async def _post_answer(self, job: Job) -> None:
        """Post the reply; confirm the request once the broker has it (one post per
        reply GUID: a redelivery answered meanwhile rides on it)."""
        assert job.answer is not None
        key = job.request.guid.bytes
        waiting = self._posting.get(key)
        if waiting is not None:
            waiting.append(job)
            return
        self._posting[key] = [job]
        payload, properties = job.answer
        if job.durable:
            kept = wire.kept_reply(properties, job.keep_until_ms)
            if kept is None:  # past its keep time: nobody may fetch it any more
                for each in self._posting.pop(key, []):
                    confirm(each.message)
                return
            properties = kept
        else:  # unread past its call's deadline, it would stay in the broker for good
            properties = wire.expiring_reply(properties, job.message.properties)
        try:
            queue = await self._reply_queue(job.reply_to)
            with tracing.suppressed():  # the serve span covers the reply
                await queue.post(
                    payload,
                    properties,
                    lambda ack: self._on_reply_ack(key, ack),
                    guid=wire.reply_guid(job.request.guid),
                )
        except HoldfastError as error:  # refused reply queue, reply over the limits
            jobs = self._posting.pop(key, [])
            if properties.get(wire.KIND) == wire.FAILURE:
                log.error("cannot post the error reply to %s: %s", job.request.guid, error)
                for each in jobs:
                    confirm(each.message)
                return
            answer = handler_error(job.request.guid, error)
            self._replies[key] = answer
            for each in jobs:
                each.answer = answer
                await self._post_answer(each)

    def _on_reply_ack(self, key: bytes, ack: Ack) -> None:
        jobs = self._posting.pop(key, [])
        if ack.status is AckStatus.UNKNOWN and not self._stopping:
            # It may not be in the queue: post it again under the same GUID (dedup).
            for job in jobs:
                self._keep(asyncio.get_running_loop().create_task(self._post_answer(job)))
            return
        log_reply_ack(key, ack)
        for job in jobs:
            confirm(job.message)

    async def _reply_queue(self, uri: str) -> Queue:
        queue = self._handles.get(uri)
        if queue is None or not queue.is_open:
            queue = self._handles[uri] = await self._session.open_queue(uri, write=True)
        return queue

    # ------------------------------------------------------------------ cancels, liveness

    def _on_control(self, message: Message) -> None:
        key = wire.request_key(message.properties)
        if message.properties.get(wire.KIND) == wire.CANCEL and key is not None:
            self._cancel(key)
        confirm(message)

    def _cancel(self, guid: bytes) -> None:
        job = self._running.get(guid)
        if job is not None:
            job.request.cancelled.set()
            task = self._tasks.get(guid)
            if task is not None:
                streaming.cancel_handler(
                    job.request.streams, task, lambda: self._tasks.get(guid) is task
                )

    async def _beat_loop(self) -> None:
        options = self.options
        tick = min(options.first_beat_after, options.heartbeat_interval) / 2
        next_check = time.monotonic() + options.heartbeat_interval
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            jobs = [job for job in self._running.values() if not job.durable]
            connected = self._session.connected
            for job in jobs:
                if connected and now >= job.next_beat and not job.request.cancelled.is_set():
                    job.next_beat = now + options.heartbeat_interval
                    beat = wire.beat_properties(
                        job.request.guid, self.control_uri, options.heartbeat_interval
                    )
                    with contextlib.suppress(HoldfastError), tracing.suppressed():
                        await (await self._reply_queue(job.reply_to)).post(b"", beat)
            if now >= next_check:
                next_check = now + options.heartbeat_interval
                await self._check_callers(jobs, now)

    async def _check_callers(self, jobs: list[Job], now: float) -> None:
        """Cancel the calls of callers whose reply queue lost its consumer for good."""
        grace = self.options.caller_grace
        callers = {job.reply_to for job in jobs}
        for gone in set(self._absent_since) - callers:
            del self._absent_since[gone]
        for reply_to in callers:
            try:
                present = await self._session.has_workers(reply_to, timeout=grace)
            except HoldfastError:
                continue  # no answer (the link is down): no verdict
            if present:
                self._absent_since.pop(reply_to, None)
                continue
            since = self._absent_since.setdefault(reply_to, now)
            if now - since >= grace:
                log.info("caller of %s is gone: cancelling its calls", reply_to[:200])
                for job in jobs:
                    if job.reply_to == reply_to:
                        self._cancel(job.request.guid.bytes)


__all__ = ["AsyncHandler", "Worker"]

"""``await session.request(...)`` on the asyncio ``Session``: a caller on the event loop.

The same call rules as the threaded caller (``holdfast.sdk.rpc.calls``: deadlines,
heartbeats, the broker's dead-letter notices, cancels), run on the loop: one reply
queue per domain (``hf://<domain>/rpc-reply-<random>``, reopened with the session),
each call an ``asyncio.Future`` completed by its reply message, and a loop timer
(``call_at``) per call for its pickup deadline and timeout; no thread. Cancelling
the awaiting task cancels the call and tells its worker, like a timeout does. A
call's data streams are sent by tasks of its own (``holdfast.sdk.aio.streams``),
cancelled when the call ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from holdfast.sdk import tracing
from holdfast.sdk.aio import streams as streaming
from holdfast.sdk.errors import (
    CallLostError,
    HoldfastError,
    RequestTimeoutError,
    RpcCancelledError,
    RpcError,
)
from holdfast.sdk.guids import Uuid7Source
from holdfast.sdk.instrument import Untraced
from holdfast.sdk.poolnames import key_queue_uri
from holdfast.sdk.rpc import calls, chunks, wire
from holdfast.sdk.rpc import spans as rpc_spans
from holdfast.sdk.rpc.calls import ABANDONED_MEMORY, MAX_WORKER_HANDLES, PICKUP_WAIT, CallState
from holdfast.sdk.rpc.edges import Edges
from holdfast.sdk.rpc.values import Reply
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.aio.queue import Queue
    from holdfast.sdk.aio.session import Session

log = logging.getLogger("holdfast.sdk.rpc")


@dataclass(slots=True, eq=False)
class _Call(CallState):
    future: asyncio.Future[Reply] | None = field(default=None, repr=False)
    told: asyncio.Future[None] | None = field(default=None, repr=False)
    """Done once the broker has the chunk telling a reader why the call failed: its
    cancel waits for it (``streaming.Failing``)."""


class AsyncCaller:
    """Issues calls over an asyncio ``session`` and matches their replies. Use it from
    the session's loop only."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._loop = asyncio.get_running_loop()
        self._calls: dict[bytes, _Call] = {}
        self._abandoned: dict[bytes, _Call] = {}
        """Calls that ended without a reply, by GUID, for ``ABANDONED_MEMORY`` s."""
        self._queues: dict[str, Queue] = {}
        self._opening: dict[str, asyncio.Future[Queue]] = {}
        self._workers: OrderedDict[str, Queue] = OrderedDict()
        self._routes: dict[tuple[str, str | None], tuple[Queue, Queue]] = {}
        """(service URI, key) -> (its queue, the reply queue of its domain)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._guids = Uuid7Source()
        self._tag = uuid.uuid4().hex
        self._closed = False
        self._beaten = asyncio.Event()
        """Set by a heartbeat of a call over (``close`` waits for them)."""
        self._traced = session._telemetry
        self._on_replies = Untraced(self._on_reply_message)  # the call span covers them
        self._edges = Edges()
        self._timer: asyncio.TimerHandle | None = None
        """One loop timer, for the first of ``_edges``."""

    async def call(
        self,
        uri: str,
        payload: bytes,
        *,
        properties: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        key: str | None = None,
        pickup_timeout: float | None = None,
        streams: Mapping[str, streaming.AsyncSource] | None = None,
    ) -> Reply:
        """Send a request to the service queue ``uri``; await its reply (``streams``:
        see ``holdfast.sdk.aio.streams``)."""
        deadline, pickup_deadline = calls.deadlines(timeout, pickup_timeout)
        user = wire.check_user_properties(properties)
        names = chunks.check_names(streams)
        route = self._routes.get((uri, key))
        if route is None or not (route[0].is_open and route[1].is_open):
            try:  # within the call's timeout, also while the broker is unreachable
                target, domain = await self.target(uri, key, calls.left(deadline))
                reply_queue = await self._reply_queue(domain, calls.left(deadline))
            except RequestTimeoutError as error:
                raise calls.open_timed_out(uri, timeout, error) from None
            route = self._routes[(uri, key)] = (target, reply_queue)
        target, reply_to = route
        if self._closed:
            raise RpcCancelledError("the session is closing")
        guid = self._guids.next()[0]
        call = _Call(guid, deadline, pickup_deadline)
        future: asyncio.Future[Reply] = self._loop.create_future()
        call.future = future
        self._calls[guid.bytes] = call  # before the PUT: its reply may come at once
        self._arm(call)
        request = chunks.announce(calls.request_properties(call, user, reply_to.uri, key), names)
        span = rpc_spans.start_call(uri, guid, request, future) if self._traced else None
        senders: list[asyncio.Task[None]] = []
        try:
            with tracing.current(span):  # the request's send span is the call's child
                await target.post(
                    payload, request, lambda ack: self._on_request_ack(call, ack), guid=guid
                )
            if streams:
                senders = streaming.start_senders(
                    self._session,
                    calls.domain_of(uri),
                    guid,
                    streams,
                    lambda error, told: self._stream_failed(call, error, told),
                    resend=True,
                )
            return await future
        except asyncio.CancelledError:
            self._end(call)  # the application cancelled: tell the worker
            raise
        finally:
            self._calls.pop(guid.bytes, None)
            for task in senders:  # done, or no longer wanted: the call is over
                task.cancel()
                self._tasks.add(task)  # close() waits for their queues to close
                task.add_done_callback(self._tasks.discard)

    async def target(self, uri: str, key: str | None, timeout: float) -> tuple[Queue, str]:
        """The open write handle of the service queue ``uri`` (the key's own queue of a
        keyed worker pool with ``key``), and the domain of ``uri``; an open takes at
        most ``timeout`` seconds (``RequestTimeoutError``)."""
        domain = calls.domain_of(uri)
        uri = uri if key is None else key_queue_uri(uri, key)
        return await self._open(uri, timeout, write=True), domain

    def next_guid(self) -> uuid.UUID:
        """A fresh request GUID (uuid7)."""
        return self._guids.next()[0]

    async def close(self, timeout: float = 5.0) -> None:
        """Cancel every call still waiting (``RpcCancelledError``), telling their
        workers, and the workers of the calls that ended without a reply (a timeout, a
        stream that failed), also those not picked up yet: their first heartbeats are
        awaited (``calls.PICKUP_WAIT`` each, ``timeout`` in all). The session closes the
        queues (flushing the cancels)."""
        if self._closed:
            return
        self._closed = True
        for call in list(self._calls.values()):
            self._finish(call, RpcCancelledError("the session closed during the call"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._await_pickups()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def _await_pickups(self) -> None:
        """Until no call over may still be picked up unseen, or none was for
        ``PICKUP_WAIT``: each heartbeat of one sends its cancel (``_on_reply_message``)."""
        while True:
            self._beaten.clear()
            if not any(call.may_start(time.monotonic()) for call in self._abandoned.values()):
                return
            try:
                async with asyncio.timeout(PICKUP_WAIT):
                    await self._beaten.wait()
            except TimeoutError:
                return

    def store_lost(self, report: str) -> None:
        """The broker's store lost data: every call waiting now fails at once with
        ``CallLostError`` (as the synchronous ``Caller.store_lost``)."""
        for call in list(self._calls.values()):
            self._finish(call, CallLostError(f"the store lost data during the call: {report}"))

    # ------------------------------------------------------------------ replies

    def _on_reply_message(self, message: Message) -> None:
        properties = message.properties
        key = wire.request_key(properties)
        kind = properties.get(wire.KIND)
        call = self._calls.get(key) if key is not None else None
        abandoned = self._abandoned.get(key) if key is not None else None
        if abandoned is not None and kind == wire.BEAT:
            # A worker runs a call that is over: tell it to stop.
            abandoned.worker = properties.get(wire.WORKER, "")
            self._send_cancel(abandoned)
            self._beaten.set()
        elif call is not None:
            if kind == wire.BEAT:
                call.on_beat(properties, time.monotonic())
            else:
                outcome = calls.outcome(call.guid, message)
                if isinstance(outcome, Reply) and chunks.NAMES in properties:
                    readers = streaming.readers(
                        self._session,
                        calls.domain_of(message.queue_uri),
                        wire.reply_guid(call.guid),
                        properties,
                    )
                    outcome = dataclasses.replace(outcome, streams=readers)
                if outcome is not None:
                    self._finish(call, outcome)
        # redelivered later; the call is over by then, so it is dropped
        with contextlib.suppress(HoldfastError):
            message.confirm()

    def _on_request_ack(self, call: _Call, ack: Ack) -> None:
        if (error := call.on_ack(ack)) is not None:
            self._finish(call, error)

    def _finish(self, call: _Call, outcome: Reply | RpcError) -> None:
        future = call.future
        if future is None or future.done():
            return  # already over: a duplicate reply or a late error
        if isinstance(outcome, Reply):
            future.set_result(outcome)
        else:
            future.set_exception(outcome)
            if calls.ended(call, outcome):
                self._end(call)

    def _stream_failed(
        self, call: _Call, error: RpcError, told: asyncio.Future[None] | None
    ) -> None:
        if call.told is None:
            call.told = told
        self._finish(call, error)

    def _end(self, call: _Call) -> None:
        """A call over without its reply: remember it for a while (a worker that picks
        it up later is told at its first heartbeat) and tell its worker to stop."""
        if call.guid.bytes in self._abandoned:
            return
        self._abandoned[call.guid.bytes] = call
        forget = max(0.0, call.deadline - time.monotonic()) + ABANDONED_MEMORY
        self._loop.call_later(forget, self._abandoned.pop, call.guid.bytes, None)
        self._send_cancel(call)

    # ------------------------------------------------------------------ timers

    def _arm(self, call: _Call) -> None:
        edge = call.next_edge()
        if self._edges.add(edge, call.guid.bytes, self._calls):
            self._wake_at(edge)

    def _wake_at(self, edge: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, edge - time.monotonic())
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = time.monotonic()
        for key in self._edges.pop_due(now):
            call = self._calls.get(key)
            if call is None or call.future is None or call.future.done():
                continue  # over already
            error = call.due(now)
            if error is None:  # picked up since: its timeout is next
                self._edges.add(call.next_edge(), key, self._calls)
            else:
                self._finish(call, error)
        first = self._edges.first()
        if first is not None and self._timer is None:
            self._wake_at(first)

    # ------------------------------------------------------------------ cancels

    def _send_cancel(self, call: _Call) -> None:
        worker = call.wants_cancel()
        if not worker:
            return  # not picked up yet (its first heartbeat triggers it), or sent
        task = self._loop.create_task(self._post_cancel(worker, call.guid, call.told))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post_cancel(
        self, worker: str, guid: uuid.UUID, told: asyncio.Future[None] | None
    ) -> None:
        if told is not None:  # the reader first learns why, as a StreamError
            await asyncio.wait([told], timeout=chunks.CREDIT_CLOSE_WAIT)
        try:
            queue = self._workers.get(worker)
            if queue is None or not queue.is_open:
                queue = self._workers[worker] = await self._session.open_queue(worker, write=True)
            self._workers.move_to_end(worker)
            with tracing.suppressed():
                await queue.post(b"", wire.cancel_properties(guid))
            while len(self._workers) > MAX_WORKER_HANDLES:
                _, old = self._workers.popitem(last=False)
                await old.close(timeout=5)
        except (HoldfastError, ValueError) as error:
            log.warning("could not send the cancel of %s to %s: %s", guid, worker[:200], error)

    # ------------------------------------------------------------------ queues

    async def _reply_queue(self, domain: str, timeout: float) -> Queue:
        uri = f"hf://{domain}/{wire.REPLY_QUEUE_PREFIX}{self._tag}"
        options = calls.REPLY_QUEUE_OPTIONS
        return await self._open(
            uri, timeout, read=True, on_message=self._on_replies, options=options
        )

    async def _open(self, uri: str, timeout: float, **how: Any) -> Queue:
        """The open handle of ``uri``, opened now if needed, within ``timeout`` seconds
        (``RequestTimeoutError``); concurrent calls share one open."""
        queue = self._queues.get(uri)
        if queue is not None and queue.is_open:
            return queue
        pending = self._opening.get(uri)
        if pending is None:
            pending = self._opening[uri] = self._loop.create_future()
            try:
                queue = await self._session.open_queue(uri, timeout=timeout, **how)
            except BaseException as error:
                if isinstance(error, asyncio.CancelledError):
                    pending.cancel()
                else:
                    pending.set_exception(error)
                    pending.exception()  # retrieved: the waiters re-raise it
                raise
            finally:
                del self._opening[uri]
            self._queues[uri] = queue
            pending.set_result(queue)
            return queue
        try:
            return await asyncio.wait_for(asyncio.shield(pending), timeout)
        except TimeoutError:  # another call's open, still waiting
            late = RequestTimeoutError(f"opening {uri} did not complete within {timeout} s")
            raise late from None


__all__ = ["AsyncCaller"]

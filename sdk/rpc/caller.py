"""The caller side of request/reply: ``Session.request`` and ``Session.request_async``.

One ``Caller`` per session, with one reply queue per domain it calls into
(``hf://<domain>/rpc-reply-<random>``, reopened with the session). Replies are
matched to calls by request GUID; anything about a call that is over is confirmed
and dropped, so each call completes exactly once. The broker's dead-letter notice
ends a call with ``DeadLetteredError``; a timer thread ends the rest at the pickup
deadline or the timeout (``calls.CallState.due``) and tells the worker to cancel.
The futures are ``concurrent.futures.Future``; the rules of one call are ``calls``,
shared with the asyncio caller (``holdfast.sdk.aio.rpc``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from holdfast.sdk import tracing
from holdfast.sdk.errors import CallLostError, HoldfastError, RpcCancelledError, RpcError
from holdfast.sdk.errors import RequestTimeoutError as OpenTimedOut
from holdfast.sdk.guids import Uuid7Source
from holdfast.sdk.instrument import Untraced
from holdfast.sdk.poolnames import key_queue_uri
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import calls, chunks, wire
from holdfast.sdk.rpc import spans as rpc_spans
from holdfast.sdk.rpc import streams as streaming
from holdfast.sdk.rpc.calls import ABANDONED_MEMORY, MAX_WORKER_HANDLES, CallState
from holdfast.sdk.rpc.edges import Edges
from holdfast.sdk.rpc.values import Reply
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.session import Session

log = logging.getLogger("holdfast.sdk.rpc")


@dataclass(slots=True, eq=False)
class _Call(CallState):
    future: concurrent.futures.Future[Reply] = field(
        default_factory=concurrent.futures.Future, repr=False
    )


class Caller:
    """Issues calls over ``session`` and matches their replies. Thread-safe."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._calls: dict[bytes, _Call] = {}
        self._abandoned: dict[bytes, _Call] = {}
        """Calls that ended without a reply, by GUID, until ``forget_at``."""
        self._reply_queues: dict[str, Queue] = {}
        self._targets: dict[str, Queue] = {}
        self._routes: dict[tuple[str, str | None], tuple[Queue, Queue]] = {}
        """(service URI, key) -> (its queue, the reply queue of its domain): a call to a
        known service parses no URI."""
        self._workers: OrderedDict[str, Queue] = OrderedDict()
        """Workers' control queues opened for cancels (used by the cancel thread only)."""
        self._guids = Uuid7Source()
        self._tag = uuid.uuid4().hex
        self._closed = False
        self._beaten = threading.Event()  # a heartbeat of a call over (close waits for them)
        self._traced = session._telemetry
        self._on_replies = Untraced(self._on_reply_message)  # the call span covers them
        self._wakeup = threading.Event()
        self._edges = Edges()
        """The calls' next edges by GUID: an ended call is freed, not kept for the GC."""
        self._next_wake = 0.0
        self._cancels = concurrent.futures.ThreadPoolExecutor(1, "holdfast-rpc-cancel")
        self._timer = threading.Thread(target=self._run_timer, name="holdfast-rpc", daemon=True)
        self._timer.start()

    # ------------------------------------------------------------------ calls

    def call_async(
        self,
        uri: str,
        payload: bytes,
        *,
        properties: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        key: str | None = None,
        pickup_timeout: float | None = None,
        streams: Mapping[str, streaming.Readable] | None = None,
    ) -> concurrent.futures.Future[Reply]:
        """Send a request to the service queue ``uri``; the future holds its reply
        (``streams``: see ``holdfast.sdk.rpc.streams``)."""
        deadline, pickup_deadline = calls.deadlines(timeout, pickup_timeout)
        user = wire.check_user_properties(properties)
        names = chunks.check_names(streams)
        route = self._routes.get((uri, key))
        if route is None or not (route[0].is_open and route[1].is_open):
            try:  # within the call's timeout, also while the broker is unreachable
                target, domain = self.target(uri, key, calls.left(deadline))
                reply_queue = self._reply_queue(domain, calls.left(deadline))
            except OpenTimedOut as error:
                raise calls.open_timed_out(uri, timeout, error) from None
            route = self._routes[(uri, key)] = (target, reply_queue)
        target, reply_to = route[0], route[1].uri
        with self._lock:
            if self._closed:
                raise RpcCancelledError("the session is closing")
            guid, _ = self._guids.next()
            call = _Call(guid, deadline, pickup_deadline)
            self._calls[guid.bytes] = call  # before the PUT: its reply may come at once
            self._schedule(call)
        future = call.future
        # By GUID: a callback holding the call (which holds the future) is a cycle.
        future.add_done_callback(functools.partial(self._on_done, guid.bytes))
        request = chunks.announce(calls.request_properties(call, user, reply_to, key), names)
        span = rpc_spans.start_call(uri, guid, request, future) if self._traced else None
        try:
            with tracing.current(span):  # the request's send span is the call's child
                target.post(
                    payload, request, lambda ack: self._on_request_ack(call, ack), guid=guid
                )
        except BaseException as error:
            with self._lock:
                self._calls.pop(guid.bytes, None)
            tracing.fail(span, error)
            raise
        if streams:
            streaming.start_senders(
                self._session,
                calls.domain_of(uri),
                guid,
                streams,
                future.done,
                lambda error: self._finish(call, error=error),
                resend=True,
            )
        return future

    def call(
        self,
        uri: str,
        payload: bytes,
        *,
        properties: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        key: str | None = None,
        pickup_timeout: float | None = None,
        streams: Mapping[str, streaming.Readable] | None = None,
    ) -> Reply:
        """``call_async(...).result()``: block until the reply or a typed ``RpcError``.

        Not from an SDK callback: replies are delivered on that thread, so waiting
        there would deadlock (``RpcError`` at once; use ``call_async`` there)."""
        self.refuse_on_dispatcher("request")
        future = self.call_async(
            uri,
            payload,
            properties=properties,
            timeout=timeout,
            key=key,
            pickup_timeout=pickup_timeout,
            streams=streams,
        )
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RpcCancelledError("the call was cancelled") from None

    def refuse_on_dispatcher(self, what: str) -> None:
        """``RpcError`` on the SDK's callback thread, where waiting for a reply (or an
        ACK) would deadlock: they arrive on that thread."""
        if self._session._dispatcher.in_dispatcher():
            raise RpcError(
                f"a blocking {what} from an SDK callback would never see its reply "
                "(replies arrive on that thread): use request_async"
            )

    def target(self, uri: str, key: str | None, timeout: float) -> tuple[Queue, str]:
        """The open write handle of the service queue ``uri`` (the key's own queue of a
        keyed worker pool with ``key``), and the domain of ``uri``; an open takes at
        most ``timeout`` seconds (``RequestTimeoutError``)."""
        domain = calls.domain_of(uri)
        if key is not None:
            uri = key_queue_uri(uri, key)
        return self._open(self._targets, uri, {"write": True}, timeout), domain

    def next_guid(self) -> uuid.UUID:
        """A fresh request GUID (uuid7)."""
        with self._lock:
            return self._guids.next()[0]

    @property
    def token(self) -> str | None:
        """The session's token (request ids are checked under it)."""
        return self._session._options.token

    def close(self) -> None:
        """Cancel every call still waiting (``RpcCancelledError``) and every call over
        that a worker may still run, also before pickup (``calls.wait_for_pickups``),
        telling their workers; stop the timer. The session closes the queues."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting = list(self._calls.values())
        for call in waiting:
            self._finish(call, error=RpcCancelledError("the session closed during the call"))
        calls.wait_for_pickups(self._abandoned, self._beaten, self._session._options.close_timeout)
        self._wakeup.set()
        self._timer.join(5)
        self._cancels.shutdown(wait=True)

    def store_lost(self, report: str) -> None:
        """The store lost data: waiting calls fail at once (``CallLostError``), not
        after their timeout; their workers are told to stop."""
        with self._lock:
            waiting = list(self._calls.values())
        for call in waiting:
            self._finish(call, error=CallLostError(f"the store lost data: {report}"))

    # ------------------------------------------------------------------ replies

    def _on_reply_message(self, message: Message) -> None:
        properties = message.properties
        key = wire.request_key(properties)
        kind = properties.get(wire.KIND)
        with self._lock:
            call = self._calls.get(key) if key is not None else None
            abandoned = self._abandoned.get(key) if key is not None else None
        if abandoned is not None and kind == wire.BEAT:
            # A worker runs a call over (cancelled, timed out, or redelivered): stop it.
            abandoned.worker = properties.get(wire.WORKER, "")
            self._send_cancel(abandoned)
            self._beaten.set()
        elif call is not None:
            if kind == wire.BEAT:
                with self._lock:
                    call.on_beat(properties, time.monotonic())
            else:
                outcome = calls.outcome(call.guid, message)
                if isinstance(outcome, Reply) and chunks.NAMES in properties:
                    domain = calls.domain_of(message.queue_uri)
                    reply_guid = wire.reply_guid(call.guid)
                    readers = streaming.readers(self._session, domain, reply_guid, properties)
                    outcome = dataclasses.replace(outcome, streams=readers)
                if isinstance(outcome, Reply):
                    self._finish(call, reply=outcome)
                elif outcome is not None:
                    self._finish(call, error=outcome)
        # redelivered later; the call is over by then, so it is dropped
        with contextlib.suppress(HoldfastError):
            message.confirm()

    def _on_request_ack(self, call: _Call, ack: Ack) -> None:
        if (error := call.on_ack(ack)) is not None:
            self._finish(call, error=error)

    def _finish(
        self, call: _Call, *, reply: Reply | None = None, error: RpcError | None = None
    ) -> None:
        with self._lock:
            if self._calls.pop(call.guid.bytes, None) is None:
                return  # already over: a duplicate reply or a late error
        try:
            if error is not None:
                call.future.set_exception(error)
            else:
                call.future.set_result(reply)  # type: ignore[arg-type]
        except concurrent.futures.InvalidStateError:
            self._abandon(call)  # the application cancelled the future meanwhile
            return
        if error is not None and calls.ended(call, error):
            self._abandon(call)

    def _on_done(self, key: bytes, future: concurrent.futures.Future[Reply]) -> None:
        """An application's cancel ends the call here; ``_finish`` ends the others."""
        if not future.cancelled():
            return
        with self._lock:
            call = self._calls.pop(key, None)
        if call is not None:
            self._abandon(call)

    def _abandon(self, call: _Call) -> None:
        """A call over without its reply: tell its worker to stop. Remembered for a while:
        a worker that picks it up later (or a redelivery) is told at its first heartbeat."""
        with self._lock:
            call.forget_at = max(call.deadline, time.monotonic()) + ABANDONED_MEMORY
            self._abandoned[call.guid.bytes] = call
        self._send_cancel(call)

    # ------------------------------------------------------------------ cancel

    def _send_cancel(self, call: _Call) -> None:
        with self._lock:
            worker = call.wants_cancel()
        if not worker:
            return  # not picked up yet (its first heartbeat triggers it), or sent
        # closing: the worker notices the caller is gone instead
        with contextlib.suppress(RuntimeError):
            self._cancels.submit(tracing.suppressed_call, self._post_cancel, worker, call.guid)

    def _post_cancel(self, worker: str, guid: uuid.UUID) -> None:
        """On the cancel thread: post to the worker's control queue. Workers come and
        go (each has its own control queue), so only the most recent handles stay open."""
        try:
            queue = self._open(self._workers, worker, {"write": True}, 30.0)
            self._workers.move_to_end(worker)
            queue.post(b"", wire.cancel_properties(guid))
            while len(self._workers) > MAX_WORKER_HANDLES:
                _, old = self._workers.popitem(last=False)
                old.close(timeout=5)
        except (HoldfastError, ValueError) as error:
            log.warning("could not send the cancel of %s to %s: %s", guid, worker[:200], error)

    # ------------------------------------------------------------------ queues

    def _reply_queue(self, domain: str, timeout: float) -> Queue:
        uri = f"hf://{domain}/{wire.REPLY_QUEUE_PREFIX}{self._tag}"
        how = {"read": True, "on_message": self._on_replies, "options": calls.REPLY_QUEUE_OPTIONS}
        return self._open(self._reply_queues, uri, how, timeout)

    def _open(
        self, cache: dict[str, Queue], uri: str, how: dict[str, Any], timeout: float
    ) -> Queue:
        """The open handle of ``uri`` in ``cache``, opened now if needed (blocks, at most
        ``timeout`` seconds: ``RequestTimeoutError``)."""
        queue = cache.get(uri)
        if queue is not None and queue.is_open:
            return queue
        if not self._open_lock.acquire(timeout=timeout):  # another call's open is slow
            raise OpenTimedOut(f"opening {uri} did not complete within {timeout} s")
        try:
            queue = cache.get(uri)
            if queue is None or not queue.is_open:
                queue = self._session.open_queue(uri, timeout=timeout, **how)
                cache[uri] = queue
        finally:
            self._open_lock.release()
        return queue

    # ------------------------------------------------------------------ the timer thread

    def _schedule(self, call: _Call) -> None:
        """Time ``call`` (under the lock); wake the timer only if it is due before the
        timer's next wake-up (rarely: calls mostly share one timeout, so a new call is
        due after those already timed)."""
        edge = call.next_edge()
        self._edges.add(edge, call.guid.bytes, self._calls)
        if edge < self._next_wake:
            self._next_wake = edge
            self._wakeup.set()

    def _run_timer(self) -> None:
        """Ends the calls whose deadline passed (O(log n) a call: ``_edges``)."""
        next_purge = time.monotonic() + ABANDONED_MEMORY
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                due: list[tuple[_Call, RpcError]] = []
                edges = self._edges
                for key in edges.pop_due(now):
                    call = self._calls.get(key)
                    if call is None:
                        continue  # over already
                    error = call.due(now)
                    if error is not None:
                        due.append((call, error))
                    else:  # picked up since: its timeout is next
                        edges.add(call.next_edge(), key, self._calls)
                if now >= next_purge:
                    next_purge = now + ABANDONED_MEMORY
                    for key in [k for k, c in self._abandoned.items() if c.forget_at <= now]:
                        del self._abandoned[key]
                first = edges.first()
                wake = min(now + ABANDONED_MEMORY if first is None else first, next_purge)
                self._next_wake = wake
                self._wakeup.clear()
            for call, error in due:
                self._finish(call, error=error)
            self._wakeup.wait(max(0.0, wake - time.monotonic()))

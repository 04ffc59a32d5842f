"""The caller side of request/reply: ``Session.request`` and ``Session.request_async``.

One ``Caller`` per session. It opens one reply queue per domain it calls into
(``hf://<domain>/rpc-reply-<random>``), as an ordinary queue of the session, so the
session reopens it after every reconnect. Calls are kept by request GUID; what arrives
on the reply queue is matched to them, and anything about a call that is over (a late
duplicate, a heartbeat) is confirmed and dropped, so each call completes exactly once.

The broker ends a call first when it dead-letters the request: it was not picked up
within its pickup TTL (sent a little under the pickup timeout,
``wire.broker_pickup_ms``) or reached the service queue's delivery limit; its notice on
the reply queue becomes ``DeadLetteredError`` with the broker's reason. A timer thread
ends the rest: at the pickup deadline if no worker has picked the request up and no
notice came (the broker unreachable: ``DeadLetteredError``, reason ``expired``), at the
call's timeout otherwise (``WorkerLostError`` if the worker stopped heartbeating, else
``RpcTimeoutError``), telling the worker to cancel. The futures are
``concurrent.futures.Future``; an asyncio front-end wraps them with
``asyncio.wrap_future``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from holdfast.proto.uri import parse_queue_uri
from holdfast.sdk import tracing
from holdfast.sdk.errors import (
    DeadLetteredError,
    HoldfastError,
    InvalidArgumentError,
    InvalidQueueUriError,
    RemoteHandlerError,
    RequestRefusedError,
    RpcCancelledError,
    RpcError,
    RpcTimeoutError,
    WorkerLostError,
    WorkerStartError,
)
from holdfast.sdk.guids import Uuid7Source
from holdfast.sdk.instrument import Untraced
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.poolnames import key_queue_uri
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import spans as rpc_spans
from holdfast.sdk.rpc import wire
from holdfast.sdk.rpc.values import Reply
from holdfast.sdk.types import Ack, AckStatus, Message

if TYPE_CHECKING:
    from holdfast.sdk.session import Session

log = logging.getLogger("holdfast.sdk.rpc")

REPLY_QUEUE_OPTIONS = QueueOptions(max_unconfirmed_messages=100_000)
"""Flow limits of a reply queue: replies are small and confirmed at once."""

LOST_AFTER_BEATS = 3
"""A worker is presumed lost after this many heartbeat intervals of silence."""

MAX_WORKER_HANDLES = 64
"""Workers' control queues kept open for cancels (least recently used closed)."""

ABANDONED_MEMORY = 60.0
"""Seconds past its deadline a call that ended without a reply is remembered, to
cancel a worker that picks it up late."""

TICK = 0.05
"""Seconds between the timer thread's checks when no deadline is nearer."""


@dataclass(slots=True, eq=False)
class _Call:
    guid: uuid.UUID
    future: concurrent.futures.Future[Reply]
    deadline: float
    pickup_deadline: float
    picked_up: bool = False
    worker: str = ""
    last_beat: float = 0.0
    beat_interval: float = 1.0
    cancelled_worker: str = ""
    forget_at: float = 0.0

    def lost(self, now: float) -> bool:
        return self.picked_up and now - self.last_beat > LOST_AFTER_BEATS * self.beat_interval


class Caller:
    """Issues calls over ``session`` and matches their replies. Thread-safe."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._traced = session._telemetry
        self._on_replies = Untraced(self._on_reply_message)  # the call span covers them
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._calls: dict[bytes, _Call] = {}
        self._abandoned: dict[bytes, _Call] = {}
        """Calls that ended without a reply, by GUID, until ``forget_at``."""
        self._reply_queues: dict[str, Queue] = {}
        self._targets: dict[str, Queue] = {}
        self._workers: OrderedDict[str, Queue] = OrderedDict()
        """Workers' control queues opened for cancels (used by the cancel thread only)."""
        self._guids = Uuid7Source()
        self._tag = uuid.uuid4().hex
        self._closed = False
        self._wakeup = threading.Event()
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
    ) -> concurrent.futures.Future[Reply]:
        """Send a request to the service queue ``uri``; the future holds its reply."""
        if timeout <= 0:
            raise InvalidArgumentError("timeout must be > 0")
        pickup = timeout if pickup_timeout is None else pickup_timeout
        if not 0 < pickup <= timeout:
            raise InvalidArgumentError("pickup_timeout must be in (0, timeout]")
        user = wire.check_user_properties(properties)
        domain = _domain(uri)
        if key is not None:
            uri = key_queue_uri(uri, key)  # a keyed worker pool: the key's own queue
        target = self._open(self._targets, uri, {"write": True})
        reply_to = self._reply_queue(domain).uri
        now = time.monotonic()
        future: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RpcCancelledError("the session is closing")
            guid, _ = self._guids.next()
            call = _Call(guid, future, now + timeout, now + pickup)
            self._calls[guid.bytes] = call  # before the PUT: its reply may come at once
        future.add_done_callback(lambda f: self._on_done(call, f))
        expires = wire.wall_ms() + round(pickup * 1000)
        properties = wire.request_properties(
            user, reply_to, expires, key, wire.broker_pickup_ms(pickup)
        )
        span = rpc_spans.start_call(uri, guid, properties, future) if self._traced else None
        try:
            with tracing.current(span):  # the request's send span is the call's child
                target.post(
                    payload, properties, lambda ack: self._on_request_ack(call, ack), guid=guid
                )
        except BaseException as error:
            with self._lock:
                self._calls.pop(guid.bytes, None)
            tracing.fail(span, error)
            raise
        self._wakeup.set()
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
    ) -> Reply:
        """``call_async(...).result()``: block until the reply or a typed ``RpcError``.

        Not from an SDK callback: replies are delivered on that thread, so waiting
        there would deadlock (``RpcError`` at once; use ``call_async`` there)."""
        if self._session._dispatcher.in_dispatcher():
            raise RpcError(
                "a blocking request from an SDK callback would never see its reply "
                "(replies arrive on that thread): use request_async"
            )
        future = self.call_async(
            uri,
            payload,
            properties=properties,
            timeout=timeout,
            key=key,
            pickup_timeout=pickup_timeout,
        )
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RpcCancelledError("the call was cancelled") from None

    def close(self) -> None:
        """Cancel every call still waiting (``RpcCancelledError``), telling their
        workers; stop the timer. The session closes the queues."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            calls = list(self._calls.values())
        for call in calls:
            self._finish(call, error=RpcCancelledError("the session closed during the call"))
        self._wakeup.set()
        self._timer.join(5)
        self._cancels.shutdown(wait=True)

    # ------------------------------------------------------------------ replies

    def _on_reply_message(self, message: Message) -> None:
        properties = message.properties
        guid = wire.parse_request_guid(properties)
        kind = properties.get(wire.KIND)
        with self._lock:
            call = self._calls.get(guid.bytes) if guid is not None else None
            abandoned = self._abandoned.get(guid.bytes) if guid is not None else None
        if abandoned is not None and kind == wire.BEAT:
            # A worker runs a call that is over (cancelled, timed out, or redelivered
            # after its worker was lost): tell it to stop.
            abandoned.worker = properties.get(wire.WORKER, "")
            self._send_cancel(abandoned)
        elif call is not None:
            if kind == wire.BEAT:
                self._on_beat(call, properties)
            elif kind == wire.REPLY:
                reply = Reply(message.payload, wire.user_properties(properties), call.guid)
                self._finish(call, reply=reply)
            elif kind == wire.FAILURE:
                self._finish(call, error=_remote_error(properties, message.payload))
            elif kind is None and wire.DEATH_REASON in properties:  # the broker's notice
                reason = properties[wire.DEATH_REASON][:64]
                self._finish(
                    call, error=DeadLetteredError(reason, wire.dead_letter_text(properties))
                )
        # redelivered later; the call is over by then, so it is dropped
        with contextlib.suppress(HoldfastError):
            message.confirm()

    def _on_beat(self, call: _Call, properties: Mapping[str, str]) -> None:
        worker = properties.get(wire.WORKER, "")
        try:
            interval = max(0.001, int(properties.get(wire.BEAT_MS, "1000")) / 1000)
        except ValueError:
            interval = 1.0
        with self._lock:
            call.picked_up = True
            call.last_beat = time.monotonic()
            call.beat_interval = interval
            call.worker = worker

    def _on_request_ack(self, call: _Call, ack: Ack) -> None:
        if ack.status.ok or ack.status is AckStatus.UNKNOWN:
            return  # UNKNOWN: it may be in the queue; the timeout decides
        self._finish(call, error=RequestRefusedError(ack.status.value, "request not enqueued"))

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
            pass  # the application cancelled the future meanwhile

    def _on_done(self, call: _Call, future: concurrent.futures.Future[Reply]) -> None:
        """Any end of a call: tell its worker to stop unless the worker answered. The
        call is remembered for a while, so a worker that picks it up later (or a
        redelivery) is told too, at its first heartbeat."""
        if not future.cancelled() and not isinstance(
            future.exception(), (RpcTimeoutError, RpcCancelledError, DeadLetteredError)
        ):
            return
        with self._lock:
            self._calls.pop(call.guid.bytes, None)
            call.forget_at = max(call.deadline, time.monotonic()) + ABANDONED_MEMORY
            self._abandoned[call.guid.bytes] = call
        self._send_cancel(call)

    # ------------------------------------------------------------------ cancel

    def _send_cancel(self, call: _Call) -> None:
        with self._lock:
            worker = call.worker
            if not worker or worker == call.cancelled_worker:
                return  # not picked up yet (its first heartbeat triggers it), or sent
            call.cancelled_worker = worker
        # closing: the worker notices the caller is gone instead
        with contextlib.suppress(RuntimeError):
            self._cancels.submit(tracing.suppressed_call, self._post_cancel, worker, call.guid)

    def _post_cancel(self, worker: str, guid: uuid.UUID) -> None:
        """On the cancel thread: post to the worker's control queue. Workers come and
        go (each has its own control queue), so only the most recent handles stay open."""
        try:
            queue = self._open(self._workers, worker, {"write": True})
            self._workers.move_to_end(worker)
            queue.post(b"", wire.cancel_properties(guid))
            while len(self._workers) > MAX_WORKER_HANDLES:
                _, old = self._workers.popitem(last=False)
                old.close(timeout=5)
        except (HoldfastError, ValueError) as error:
            log.warning("could not send the cancel of %s to %s: %s", guid, worker[:200], error)

    # ------------------------------------------------------------------ queues

    def _reply_queue(self, domain: str) -> Queue:
        uri = f"hf://{domain}/rpc-reply-{self._tag}"
        return self._open(
            self._reply_queues,
            uri,
            {"read": True, "on_message": self._on_replies, "options": REPLY_QUEUE_OPTIONS},
        )

    def _open(self, cache: dict[str, Queue], uri: str, how: dict[str, Any]) -> Queue:
        """The open handle of ``uri`` in ``cache``, opened now if needed (blocks)."""
        queue = cache.get(uri)
        if queue is not None and queue.is_open:
            return queue
        with self._open_lock:
            queue = cache.get(uri)
            if queue is None or not queue.is_open:
                queue = self._session.open_queue(uri, **how)
                cache[uri] = queue
        return queue

    # ------------------------------------------------------------------ the timer thread

    def _run_timer(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                due: list[tuple[_Call, RpcError]] = []
                nearest = now + TICK
                idle = not self._calls
                for call in self._calls.values():
                    if not call.picked_up and now >= call.pickup_deadline:
                        due.append((call, _expired(call, now)))
                    elif now >= call.deadline:
                        due.append((call, _timed_out(call, now)))
                    else:
                        edge = call.deadline if call.picked_up else call.pickup_deadline
                        nearest = min(nearest, edge)
                for key in [k for k, c in self._abandoned.items() if c.forget_at <= now]:
                    del self._abandoned[key]
            for call, error in due:
                self._finish(call, error=error)
            if idle:  # nothing to time: sleep until a call starts (or purge later)
                self._wakeup.wait(ABANDONED_MEMORY if self._abandoned else None)
            else:
                self._wakeup.wait(max(0.0, nearest - time.monotonic()))
            self._wakeup.clear()


def _domain(uri: str) -> str:
    try:
        return parse_queue_uri(uri).domain
    except ValueError as error:
        raise InvalidQueueUriError(str(error)[:300]) from None


def _expired(call: _Call, now: float) -> RpcError:
    return DeadLetteredError(
        "expired", f"no worker picked request {call.guid} up within its pickup timeout"
    )


def _timed_out(call: _Call, now: float) -> RpcError:
    if call.lost(now):
        return WorkerLostError(
            f"the worker of request {call.guid} stopped heartbeating and no other "
            "worker answered within the timeout"
        )
    return RpcTimeoutError(f"no reply to request {call.guid} within the timeout")


def _remote_error(properties: Mapping[str, str], payload: bytes) -> RpcError:
    text = payload[: wire.MAX_ERROR_TEXT].decode("utf-8", "replace")
    if properties.get(wire.ERROR) == wire.DEAD_LETTER:
        return DeadLetteredError(properties.get(wire.DEATH_REASON, "unknown")[:64], text)
    if properties.get(wire.ERROR) == wire.WORKER_START:  # bounded by the broker's limits
        return WorkerStartError(properties.get(wire.POOL, ""), properties.get(wire.KEY, ""), text)
    return RemoteHandlerError(properties.get(wire.ERROR_TYPE, "Exception")[:128], text)

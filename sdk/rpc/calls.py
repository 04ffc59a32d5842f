"""The rules of one call, shared by the threaded caller (``caller``) and the asyncio
one (``holdfast.sdk.aio.rpc``): its deadlines, its heartbeats, what a message on the
reply queue means for it, and the error it ends with when no reply comes."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from holdfast.proto.uri import parse_queue_uri
from holdfast.proto.validate import MAX_PICKUP_TTL_MS
from holdfast.sdk.errors import (
    DeadLetteredError,
    InvalidArgumentError,
    InvalidQueueUriError,
    RequestRefusedError,
    RpcCancelledError,
    RpcError,
    RpcTimeoutError,
    StreamError,
    WorkerLostError,
)
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.rpc import wire
from holdfast.sdk.rpc.values import Reply
from holdfast.sdk.types import Ack, AckStatus, Message

REPLY_QUEUE_OPTIONS = QueueOptions(max_unconfirmed_messages=100_000)
"""Flow limits of a reply queue: replies are small and confirmed at once."""

LOST_AFTER_BEATS = 3
"""A worker is presumed lost after this many heartbeat intervals of silence."""

MAX_WORKER_HANDLES = 64
"""Workers' control queues kept open for cancels (least recently used closed)."""

ABANDONED_MEMORY = 60.0
"""Seconds past its deadline a call that ended without a reply is remembered, to
cancel a worker that picks it up late."""

PICKUP_WAIT = 1.0
"""Seconds a closing caller waits for the next first heartbeat of its calls that are
over but that a worker may still pick up (``CallState.may_start``): only a heartbeat
names the worker to cancel, and once the session is closed none is read (the worker
then runs the call until it finds the caller gone, ``caller_grace`` later)."""


@dataclass(slots=True, eq=False)
class CallState:
    """Where one call stands (monotonic times)."""

    guid: uuid.UUID
    deadline: float
    pickup_deadline: float
    picked_up: bool = False
    accepted: bool = False
    """Whether the broker ACKed the request PUT: until then no worker can have it."""
    worker: str = ""
    """The control queue of the worker that runs it (from its heartbeats)."""
    last_beat: float = 0.0
    beat_interval: float = 1.0
    cancelled_worker: str = ""
    """The worker already told to cancel (each is told once)."""
    forget_at: float = 0.0
    gone: bool = False
    """Whether no worker can run it any more: the broker refused or dead-lettered it."""

    def on_ack(self, ack: Ack) -> RpcError | None:
        """The broker's ACK of the request: the error the call ends with if refused."""
        self.accepted = ack.status.ok
        error = refused(ack)
        self.gone = self.gone or error is not None
        return error

    def may_start(self, now: float) -> bool:
        """Whether a worker may still pick it up unseen: no heartbeat named one yet, the
        broker took the request (or may yet), and before its pickup deadline (by then
        the broker's pickup TTL dropped a request no worker took)."""
        return not self.worker and not self.gone and now < self.pickup_deadline

    def lost(self, now: float) -> bool:
        """Whether its worker stopped heartbeating."""
        return self.picked_up and now - self.last_beat > LOST_AFTER_BEATS * self.beat_interval

    def on_beat(self, properties: Mapping[str, str], now: float) -> None:
        """A heartbeat: it is picked up, by that worker, alive now."""
        try:
            interval = max(0.001, int(properties.get(wire.BEAT_MS, "1000")) / 1000)
        except ValueError:
            interval = 1.0
        self.picked_up = True
        self.last_beat = now
        self.beat_interval = interval
        self.worker = properties.get(wire.WORKER, "")

    def next_edge(self) -> float:
        """When it is next due (``due``)."""
        return self.deadline if self.picked_up else self.pickup_deadline

    def due(self, now: float) -> RpcError | None:
        """The error it ends with at ``now``, if a deadline passed: not picked up in
        time (``DeadLetteredError``, reason ``expired``: the broker's own notice, with
        its reason, normally came first; ``RpcTimeoutError`` if the broker never took
        the request) or no reply in time (``WorkerLostError`` if
        its worker stopped heartbeating, else ``RpcTimeoutError``)."""
        if not self.picked_up and now >= self.pickup_deadline:
            if not self.accepted:
                # Never enqueued, so never dead-lettered: the service queue pushed back
                # (full) or no broker took it. The SDK may still post it later; a worker
                # skips it then, its x-rpc-expires being past.
                return RpcTimeoutError(
                    f"request {self.guid} was not taken by the broker within its pickup "
                    "timeout (the service queue pushed back, or no broker answered): "
                    "no worker could pick it up"
                )
            return DeadLetteredError(
                "expired", f"no worker picked request {self.guid} up within its pickup timeout"
            )
        if now < self.deadline:
            return None
        if self.lost(now):
            return WorkerLostError(
                f"the worker of request {self.guid} stopped heartbeating and no other "
                "worker answered within the timeout"
            )
        return RpcTimeoutError(f"no reply to request {self.guid} within the timeout")

    def wants_cancel(self) -> str:
        """The worker to tell to cancel, once (``""``: none, or told already)."""
        worker = self.worker
        if not worker or worker == self.cancelled_worker:
            return ""
        self.cancelled_worker = worker
        return worker


MAX_TIMEOUT = MAX_PICKUP_TTL_MS / 1000
"""The longest call timeout (``timeout``, ``pickup_timeout``, ``fetch_reply``'s): ten
years, the longest pickup TTL (``x-ttl-ms``) the broker takes, which a call's pickup
timeout becomes. Past it the broker refused the request with an error about a property
the caller never set, and far past it (1e12 s) a thread's wait on the threaded front-end
raised an untyped ``OverflowError``."""


def check_seconds(
    name: str, value: object, *, zero: bool = False, most: float = MAX_TIMEOUT
) -> float:
    """``value`` as a number of seconds: finite, > 0 (>= 0 with ``zero``) and at most
    ``most``; ``InvalidArgumentError`` naming ``name`` for anything else (``None``, a
    ``str``, NaN, infinity, too long)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        bound = ">= 0" if zero else "> 0"
        raise InvalidArgumentError(
            f"{name} must be a finite number of seconds {bound}, not {value!r:.80}"
        )
    if value > most:
        raise InvalidArgumentError(f"{name} must be at most {most:.0f} seconds, not {value!r:.80}")
    return float(value)


def left(deadline: float) -> float:
    """Seconds until ``deadline`` (monotonic), at least a millisecond: how long an open
    on a call's way may still take."""
    return max(0.001, deadline - time.monotonic())


def open_timed_out(uri: str, timeout: float, error: Exception) -> RpcTimeoutError:
    """The error of a call whose queues could not be opened within its ``timeout`` (the
    broker unreachable): the call's own timeout error, not the open's."""
    return RpcTimeoutError(
        f"the call to {uri[:200]} could not open its queues within its timeout of "
        f"{timeout} s: {error}"
    )


def deadlines(timeout: float, pickup_timeout: float | None) -> tuple[float, float]:
    """The deadline and the pickup deadline of a call starting now (monotonic);
    ``InvalidArgumentError`` for bad timeouts."""
    timeout = check_seconds("timeout", timeout)
    pickup = timeout if pickup_timeout is None else check_seconds("pickup_timeout", pickup_timeout)
    if not pickup <= timeout:
        raise InvalidArgumentError("pickup_timeout must be in (0, timeout]")
    now = time.monotonic()
    return now + timeout, now + pickup


def request_properties(
    call: CallState, user: dict[str, str], reply_to: str, key: str | None
) -> dict[str, str]:
    """The request PUT's properties for ``call``."""
    now, wall = time.monotonic(), wire.wall_ms()
    pickup = call.pickup_deadline - now
    expires = wall + round(pickup * 1000)
    deadline = wall + round((call.deadline - now) * 1000)
    return wire.request_properties(
        user, reply_to, expires, key, broker_pickup_ms(pickup), deadline_ms=deadline
    )


def outcome(guid: uuid.UUID, message: Message) -> Reply | RpcError | None:
    """What a reply-queue message means for the call ``guid``: its reply, its error
    (an error reply, the broker's dead-letter notice), or None (a heartbeat)."""
    properties = message.properties
    kind = properties.get(wire.KIND)
    if kind == wire.REPLY:
        return Reply(message.payload, wire.user_properties(properties), guid)
    if kind == wire.FAILURE:
        return wire.remote_error(properties, message.payload)
    if kind is None and wire.DEATH_REASON in properties:  # the broker's notice
        reason = properties[wire.DEATH_REASON][:64]
        return DeadLetteredError(reason, wire.dead_letter_text(properties))
    return None


def refused(ack: Ack) -> RpcError | None:
    """The error of a request PUT the broker refused (UNKNOWN is left to the timeout:
    the request may be in the queue)."""
    if ack.status.ok or ack.status is AckStatus.UNKNOWN:
        return None
    return RequestRefusedError(ack.status.value, "request not enqueued")


def ends_abandoned(error: BaseException | None) -> bool:
    """Whether a call that ended with ``error`` leaves a worker to cancel. A call ends
    with ``StreamError`` before its reply only when one of its own streams could not be
    sent: its handler, maybe reading another of them, would otherwise wait out the
    reader's stall timeout."""
    return isinstance(error, (RpcTimeoutError, RpcCancelledError, DeadLetteredError, StreamError))


def ended(call: CallState, error: BaseException) -> bool:
    """Note that ``call`` ended with ``error`` (a dead-lettered request is ``gone``);
    whether it leaves a worker to cancel (``ends_abandoned``)."""
    call.gone = call.gone or isinstance(error, DeadLetteredError)
    return ends_abandoned(error)


def wait_for_pickups(
    over: Mapping[bytes, CallState], beaten: threading.Event, timeout: float
) -> None:
    """The threaded caller's close: wait until none of the calls ``over`` may still be
    picked up unseen (``CallState.may_start``), ``PICKUP_WAIT`` passed without a
    heartbeat of one (``beaten``, set by each; the caller sends its cancel), or
    ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        beaten.clear()  # before looking: a heartbeat from now on ends the wait below
        now = time.monotonic()
        if now >= end or not any(call.may_start(now) for call in list(over.values())):
            return
        if not beaten.wait(min(PICKUP_WAIT, end - now)):
            return


def broker_pickup_ms(pickup: float) -> int:
    """The pickup TTL the broker enforces: a margin under the caller's own pickup
    deadline (a quarter of it, at most 1 s), so the broker's notice, with its reason,
    normally arrives before the caller's timer gives up on its own."""
    return max(1, round((pickup - min(pickup / 4, 1.0)) * 1000))


def domain_of(uri: str) -> str:
    """The domain of ``hf://<domain>/<queue>``; ``InvalidQueueUriError`` otherwise."""
    try:
        return parse_queue_uri(uri).domain
    except ValueError as error:
        raise InvalidQueueUriError(str(error)[:300]) from None

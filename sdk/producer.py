"""The producer's inputs: rules 1, 2 and 7 on the hot path of every PUT.

``post`` gives a PUT its uuid7 GUID (rule 1) and buffers it, sending it at once
while the link is ACTIVE (rule 2; a proxy's relayed PUTs take the same path under
their clients' GUIDs, ``holdfast.sdk.relaying``); ``admit_post`` is the
high-watermark wait of rule 7, decided here and only *waited* by the shell (which
reports each wait with ``note_admission_wait``); ``retry_due`` sends again the PUTs
the broker pushed back, once their back-off is over.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Mapping, Sequence
from inspect import CO_COROUTINE
from types import FunctionType
from typing import Any

from holdfast.proto.limits import DEFAULT_LIMITS, Limits
from holdfast.proto.validate import Invalid, check_payload, check_properties
from holdfast.sdk.errors import (
    BandwidthLimitError,
    BrokerBusyError,
    BufferFullError,
    InvalidArgumentError,
    NotWritableError,
    QueueNotOpenError,
)
from holdfast.sdk.guids import Uuid7Source
from holdfast.sdk.outbound import Outbound
from holdfast.sdk.putbuffer import (
    PUT_OVERHEAD,
    SIZE,
    PutBuffer,
)
from holdfast.sdk.queue_table import QueueTable
from holdfast.sdk.state import WRITABLE_STATES, LinkMachine, LinkState
from holdfast.sdk.stats import StatsCounters
from holdfast.sdk.statuses import invalid_error
from holdfast.sdk.types import Ack


def _as_bytes(payload: object) -> bytes:
    """``payload`` as bytes (a bytearray or memoryview copied), else InvalidArgumentError."""
    if isinstance(payload, bytes):
        return payload
    if not isinstance(payload, bytearray | memoryview):
        raise InvalidArgumentError(f"payload must be bytes, not {type(payload).__name__}")
    return bytes(payload)


def check_callback(name: str, callback: object) -> None:
    """InvalidArgumentError unless ``callback`` is None or a plain callable: caught where
    it is given, not as a TypeError logged when the first ACK or message arrives.

    An ``async def`` callback is refused too: callbacks are called in place and never
    awaited (on either front-end), so its body would never run, and an ``on_message``
    that never runs leaves its messages unconfirmed until the consumer stalls.
    """
    if callback is None:
        return
    if callback.__class__ is FunctionType:
        # A plain function or lambda (a request/reply call gives one a PUT): its own
        # flag says it all, and ``inspect`` would also look up and check its
        # ``__call__`` (~3 µs a post).
        if callback.__code__.co_flags & CO_COROUTINE:
            raise InvalidArgumentError(_ASYNC_CALLBACK.format(name=name))
        return
    if not callable(callback):
        raise InvalidArgumentError(f"{name} must be callable, not {type(callback).__name__}")
    if inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(
        getattr(callback, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        raise InvalidArgumentError(_ASYNC_CALLBACK.format(name=name))


_ASYNC_CALLBACK = (
    "{name} is an async function: callbacks are called in place, never awaited, "
    "so its body would never run; pass a plain function (with asyncio, iterate "
    "the queue with `async for`, or start a task from a plain function)"
)


HIGH_WATERMARK_WAIT = 5.0
"""Seconds a post waits for the outbound buffer to drain below its high watermark."""

_NO_GUID = uuid.UUID(int=0)


class Producer:
    """Checks and buffers PUTs for one session (state shared with ``SessionEngine``)."""

    def __init__(
        self,
        link: LinkMachine,
        puts: PutBuffer,
        queues: QueueTable,
        outbound: Outbound,
        counters: StatsCounters,
        check_usable: Callable[[], None],
        max_disconnected_buffer_bytes: int | None,
    ) -> None:
        self._link = link
        self._puts = puts
        self._queues = queues
        self._outbound = outbound
        self._counters = counters
        self._check_usable = check_usable
        self._disconnected_limit = max_disconnected_buffer_bytes
        self._guids = Uuid7Source()
        self.posted_at = -1.0
        """The post time the PUTs of the current millisecond share (see ``buffer``; the
        relay's PUTs share it too, ``holdfast.sdk.relaying``)."""
        self.limits: Limits = DEFAULT_LIMITS
        """The broker's announced limits, which every PUT is checked against."""

    def over_high_watermark(self) -> bool:
        """True when a live link has at least the high watermark of bytes unsent.

        Only a live link pushes back: while disconnected, PUTs are buffered
        without waiting (rule 2), bounded only by ``max_disconnected_buffer_bytes``.
        """
        return self._link.state is not LinkState.DISCONNECTED and self._outbound.over_high_watermark

    def admit_post(self, waiting_since: float, now: float, queue_id: int | None = None) -> float:
        """Rule 7: 0.0 if a post may go ahead now, else the seconds to wait (for a drain)
        before asking again. A post waits while the bytes not yet taken by the transport
        are over the high watermark, or while the broker pushes back on ``queue_id``'s
        PUTs; after ``HIGH_WATERMARK_WAIT`` seconds since ``waiting_since`` it is refused
        with ``BandwidthLimitError`` or ``BrokerBusyError``: the message is not taken."""
        outbound = self._outbound
        over = (
            self._link.state is not LinkState.DISCONNECTED
            and outbound.queued_bytes + outbound.transport_bytes >= outbound.high_watermark
        )
        busy = queue_id is not None and bool(self._puts.busy) and self._puts.holds_queue(queue_id)
        if not (over or busy):
            return 0.0
        remaining = HIGH_WATERMARK_WAIT - (now - waiting_since)
        if remaining > 0:
            return remaining
        if over:
            raise BandwidthLimitError(
                f"the outbound buffer stayed over its high watermark "
                f"({self._outbound.high_watermark} bytes) for {HIGH_WATERMARK_WAIT:.0f} s; "
                "the message was not taken"
            )
        raise BrokerBusyError(
            f"the broker pushed back on this queue's PUTs for {HIGH_WATERMARK_WAIT:.0f} s "
            "(the queue is at its depth limit, or the broker's GUID history is full); "
            "the message was not taken"
        )

    def note_admission_wait(self, queue_id: int) -> None:
        """The shell is about to make a post wait (``admit_post`` said so): count it as a
        high-watermark wait, or as a wait on the broker's push-back on ``queue_id``."""
        if self.over_high_watermark() or not self._puts.holds_queue(queue_id):
            self._counters.high_watermark_waits += 1
        else:
            self._counters.broker_busy_waits += 1

    def retry_due(self, now: float) -> None:
        """Queue again the PUTs the broker pushed back whose back-off is over; only an
        ACTIVE link sends them (a restore retransmits every pending PUT anyway)."""
        if self._link.state is not LinkState.ACTIVE:
            return
        for put in self._puts.take_due(now):
            self._outbound.add(put, put[SIZE])

    def post(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        now: float,
        guid: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Buffer a PUT under a new uuid7 GUID (and send it if the link is ACTIVE).

        ``guid`` replaces the new GUID for producers that must be idempotent across
        processes (a Spark task retried elsewhere): the caller promises it names this
        message only.
        """
        if guid is None:
            return self.buffer(queue_id, payload, properties, on_ack, now, None)
        if not isinstance(guid, uuid.UUID):
            raise InvalidArgumentError(f"guid must be a uuid.UUID, not {type(guid).__name__}")
        key = guid.bytes
        if key in self._puts:
            raise InvalidArgumentError(f"GUID {guid} is already pending on this session")
        self.buffer(queue_id, payload, properties, on_ack, now, key)
        return guid

    def past_disconnected_limit(self, active: bool, size: int) -> bool:
        """Whether ``size`` more bytes posted off-line would pass the off-line limit
        (``active``: whether the link is ACTIVE)."""
        limit = self._disconnected_limit
        return limit is not None and not active and self._puts.bytes + size > limit

    def writable_state(self, queue_id: int) -> LinkState:
        """The link's state, once the link is usable and ``queue_id`` open for writing
        (the batch paths' checks; ``buffer`` inlines them, a call less per post); raises
        what a post to it would raise otherwise."""
        state = self._link.state
        if state is LinkState.CLOSED or state is LinkState.FAILED:
            self._check_usable()
        queue = self._queues.by_id.get(queue_id)
        if queue is None or queue.state not in WRITABLE_STATES:
            raise QueueNotOpenError(f"queue {queue.uri if queue else queue_id} is not open")
        if not queue.write:
            raise NotWritableError(f"queue {queue.uri} was opened without write=True")
        return state

    def post_many(
        self,
        queue_id: int,
        payloads: Sequence[bytes],
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        now: float,
    ) -> list[uuid.UUID]:
        """``post`` each of ``payloads`` (with the same ``properties`` and ``on_ack``),
        in order, under new uuid7 GUIDs: all of them, or none if one is refused; the
        link, queue and properties checked once, ``buffer``'s loop without its calls."""
        state = self.writable_state(queue_id)
        limits = self.limits
        props: dict[str, str] | None = None
        overhead = PUT_OVERHEAD
        checked: list[bytes] = []
        total = 0
        try:
            if properties:
                props, props_size = check_properties(properties, limits)
                overhead += props_size + 4 * len(props)
            for payload in payloads:  # every one checked before any is taken
                payload = _as_bytes(payload)
                check_payload(payload, limits)
                checked.append(payload)
                total += len(payload) + overhead
        except Invalid as error:
            raise invalid_error(error) from None
        puts = self._puts
        active = state is LinkState.ACTIVE
        if self.past_disconnected_limit(active, total):
            raise BufferFullError(
                f"{puts.bytes} bytes are buffered while disconnected; these {len(checked)} "
                f"PUTs would exceed max_disconnected_buffer_bytes={self._disconnected_limit}"
            )
        # One post time for the batch (see ``buffer`` on sharing it).
        if not 0.0 <= now - self.posted_at < 0.001:
            self.posted_at = now
        posted_at = self.posted_at
        add = puts.add
        items = self._outbound.items
        guids = self._guids.next
        made: list[uuid.UUID] = []
        for payload in checked:
            guid, key = guids()
            size = len(payload) + overhead
            add(key, queue_id, payload, props, on_ack, posted_at, size)
            if active:
                items.append((key, queue_id, payload, props, on_ack, posted_at, size))
            made.append(guid)
        if active:
            self._outbound.queued_bytes += total
        return made

    def buffer(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        posted_at: float,
        key: bytes | None,
    ) -> uuid.UUID:
        """Check and buffer one PUT under ``key``, or under a new GUID if None; return
        the new GUID (a dummy when ``key`` was given, which callers ignore)."""
        # The hot path of every producer (and of the proxy, once per client PUT):
        # locals instead of repeated attribute lookups, each check done once.
        state = self._link.state
        if state is LinkState.CLOSED or state is LinkState.FAILED:
            self._check_usable()
        queue = self._queues.by_id.get(queue_id)
        if queue is None or queue.state not in WRITABLE_STATES:
            raise QueueNotOpenError(f"queue {queue.uri if queue else queue_id} is not open")
        if not queue.write:
            raise NotWritableError(f"queue {queue.uri} was opened without write=True")
        if payload.__class__ is not bytes:  # checks inlined where they pass: calls less
            payload = _as_bytes(payload)
        props: dict[str, str] | None = None
        try:
            size = len(payload)
            if size > self.limits.max_payload_bytes:
                check_payload(payload, self.limits)
            size += PUT_OVERHEAD
            if properties:
                props, props_size = check_properties(properties, self.limits)
                # Buffer accounting, not the limit: each property's tags and lengths.
                size += props_size + 4 * len(props)
        except Invalid as error:
            raise invalid_error(error) from None
        puts = self._puts
        active = state is LinkState.ACTIVE
        if not active and self.past_disconnected_limit(active, size):
            raise BufferFullError(
                f"{puts.bytes} bytes are buffered while disconnected; this PUT "
                f"would exceed max_disconnected_buffer_bytes={self._disconnected_limit}"
            )
        made = _NO_GUID
        if key is None:
            made, key = self._guids.next()
        # The PUTs of one millisecond share one float (24 B each at 100k posts/s): a
        # PUT is then up to 1 ms older than it is, never younger, and ages travel in ms.
        if 0.0 <= posted_at - self.posted_at < 0.001:
            posted_at = self.posted_at
        else:
            self.posted_at = posted_at
        extra = (
            None
            if props is None and on_ack is None
            else (props, on_ack, size - len(payload) - PUT_OVERHEAD)
        )
        puts.segments.append(key, queue_id, payload, posted_at, extra)
        puts.bytes += size
        if active:
            # Added to the outbound queue in place: a method call would be ~5 % of a post.
            outbound = self._outbound
            outbound.items.append((key, queue_id, payload, props, on_ack, posted_at, size))
            outbound.queued_bytes += size
        return made

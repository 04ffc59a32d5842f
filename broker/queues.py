"""Queues, their consumers, and the session-side handles on them.

A ``Queue`` exists per URI, created the first time any session opens it. It holds
its ready messages in a deque, the consumers that may receive them, its GUID
history and the GUIDs whose store write is still in flight. Delivery is round-robin
over the consumers that have room under their unconfirmed-message and -byte limits.
A consumer's unconfirmed messages go back to the front of the queue, in their
original order, when the consumer goes away; their next PUSH carries the next
delivery count.

A PUSH leaves only once the store has made its new delivery count durable
(``Updates``), so a redelivery after a crash, even a kill -9, always counts higher
than every delivery before it. With the memory store that costs nothing (its
writes are done at once); with SQLite a PUSH waits for the next group commit.

Everything here is synchronous and runs on the broker's event loop: no locks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from holdfast.broker.dedup import (
    DEFAULT_GRACE,
    DEFAULT_WINDOW,
    GuidHistory,
    HistoryBudget,
    default_max_guids,
)
from holdfast.broker.store import (
    Completed,
    DeliveryUpdate,
    MessageKey,
    RecoveredState,
    Store,
    StoreBatch,
    StoredMessage,
    settle,
)
from holdfast.proto import pb
from holdfast.proto.limits import DEFAULT_MAX_UNCONFIRMED_BYTES, DEFAULT_MAX_UNCONFIRMED_MESSAGES

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """How much a consumer may hold unconfirmed. Delivery to it stops while it holds
    ``max_messages`` messages or ``max_bytes`` payload bytes; 0 pauses it."""

    max_messages: int = DEFAULT_MAX_UNCONFIRMED_MESSAGES
    max_bytes: int = DEFAULT_MAX_UNCONFIRMED_BYTES

    @classmethod
    def from_wire(cls, options: pb.QueueOptions | None) -> FlowLimits:
        """The limits in ``options``, or the defaults when the message is absent."""
        if options is None:
            return cls()
        return cls(options.max_unconfirmed_messages, options.max_unconfirmed_bytes)


class PushSink(Protocol):
    """Where a consumer's PUSHes go: the outbox of the session that owns it."""

    def push(self, queue_id: int, message: StoredMessage, delivery_count: int) -> None:
        """Queue a PUSH of ``message`` to the client under handle ``queue_id``."""
        ...


class Consumer:
    """A queue handle opened with read: receives PUSHes within its flow limits."""

    __slots__ = ("limits", "queue_id", "sink", "unconfirmed", "unconfirmed_bytes")

    def __init__(self, queue_id: int, sink: PushSink, limits: FlowLimits) -> None:
        self.queue_id = queue_id
        self.sink = sink
        self.limits = limits
        self.unconfirmed: dict[bytes, StoredMessage] = {}
        """PUSHed, not yet confirmed, in delivery order (dicts keep insertion order)."""
        self.unconfirmed_bytes = 0

    def has_room(self) -> bool:
        """Whether the consumer is under both of its limits."""
        limits = self.limits
        return (
            len(self.unconfirmed) < limits.max_messages
            and self.unconfirmed_bytes < limits.max_bytes
        )


PendingPush = tuple[Consumer, StoredMessage, int]
"""A PUSH waiting for its delivery count to be durable: (consumer, message, count)."""


class Updates:
    """Confirmations and delivery-count changes, gathered during one turn of the event
    loop and handed to the store as one batch at the end of it. The PUSHes carrying
    the new counts leave once that batch is durable."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._batch = StoreBatch()
        self._pushes: list[PendingPush] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def removed(self, queue_uri: str, guid: bytes) -> None:
        """``guid`` was confirmed and left ``queue_uri``."""
        self._batch.removed.append(MessageKey(queue_uri, guid))
        self._schedule()

    def delivered(self, updates: Iterable[DeliveryUpdate], pushes: list[PendingPush]) -> None:
        """Messages were handed to consumers and their delivery counts changed; their
        PUSHes leave once the counts are durable."""
        self._batch.delivered.extend(updates)
        self._pushes.extend(pushes)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Hand what was gathered to the store now, without waiting for it."""
        self._scheduled = False
        batch, self._batch = self._batch, StoreBatch()
        pushes, self._pushes = self._pushes, []
        if batch:
            result = self._store.write(batch)
            if isinstance(result, Completed):
                _send(pushes)
                return
            task = asyncio.get_running_loop().create_task(self._settle(result, batch, pushes))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _settle(
        self, result: Awaitable[None], batch: StoreBatch, pushes: list[PendingPush]
    ) -> None:
        try:
            await settle(result)
        except Exception:
            # Not fatal: a confirmed message may come back after a restart, and a count
            # not made durable may repeat after one (logged; delivery matters more).
            log.exception(
                "the store failed to record %d confirmations and %d delivery counts",
                len(batch.removed),
                len(batch.delivered),
            )
        _send(pushes)

    async def drain(self) -> None:
        """Flush and wait until every batch handed over has settled."""
        self.flush()
        while self._tasks:
            await asyncio.wait(list(self._tasks))


def _send(pushes: list[PendingPush]) -> None:
    """PUSH what is still the consumer's under the same count (a consumer that left
    meanwhile gave its messages back; their next delivery counts higher)."""
    for consumer, message, count in pushes:
        if consumer.unconfirmed.get(message.guid) is message and message.delivery_count == count:
            consumer.sink.push(consumer.queue_id, message, count)


class Queue:
    """One queue: ready messages, consumers, GUID history and in-flight GUIDs."""

    def __init__(self, uri: str, history: GuidHistory, updates: Updates) -> None:
        self.uri = uri
        self.ready: deque[StoredMessage] = deque()
        self.history = history
        self.in_flight: dict[bytes, tuple[asyncio.Future[bool], int]] = {}
        """GUIDs accepted but still being written to the store -> (the future that says
        whether that write succeeded, the content digest). A PUT of such a GUID is a
        replay whose ACK must wait for the original's outcome."""
        self.live: dict[bytes, StoredMessage] = {}
        """Every message of the queue, ready or unconfirmed, by GUID: a GUID is known
        while its message lives, whatever the window."""
        self._consumers: list[Consumer] = []
        self._next = 0
        self._updates = updates
        # Counters read by the metrics collector (holdfast.broker.metrics).
        self.accepted = 0
        """PUTs accepted into this queue."""
        self.pushed = 0
        """PUSHes of this queue's messages, redeliveries included."""
        self.dedup_hits = 0
        """Replayed PUTs ACKed without being enqueued again."""

    @property
    def consumers(self) -> tuple[Consumer, ...]:
        """The consumers attached now, in round-robin order."""
        return tuple(self._consumers)

    def enqueue(self, messages: Iterable[StoredMessage]) -> None:
        """Append newly accepted (already durable) messages; call ``deliver()`` after."""
        live = self.live
        for message in messages:
            live[message.guid] = message
            self.ready.append(message)

    def attach(self, consumer: Consumer) -> None:
        """Start delivering to ``consumer``."""
        if consumer not in self._consumers:
            self._consumers.append(consumer)
        self.deliver()

    def detach(self, consumer: Consumer, redeliver: bool = True) -> int:
        """Stop delivering to ``consumer``; its unconfirmed messages go back to the front
        of the queue in their original order and (unless ``redeliver`` is false, for a
        caller detaching several consumers before one ``deliver()``) are delivered
        again. Returns how many went back."""
        try:
            index = self._consumers.index(consumer)
        except ValueError:
            return 0
        del self._consumers[index]
        if index < self._next:
            self._next -= 1
        if self._next >= len(self._consumers):
            self._next = 0
        returned = list(consumer.unconfirmed.values())
        consumer.unconfirmed.clear()
        consumer.unconfirmed_bytes = 0
        if returned:
            self.ready.extendleft(reversed(returned))
            if redeliver:
                self.deliver()
        return len(returned)

    def confirm(self, consumer: Consumer, guid: bytes) -> bool:
        """Remove ``guid`` if ``consumer`` holds it unconfirmed; say whether it did.
        Call ``deliver()`` after a batch of confirmations."""
        message = consumer.unconfirmed.pop(guid, None)
        if message is None:
            return False
        consumer.unconfirmed_bytes -= len(message.payload)
        self.live.pop(guid, None)
        self._updates.removed(self.uri, guid)
        return True

    def deliver(self) -> None:
        """PUSH ready messages round-robin to the consumers with room, until the queue
        is empty or every consumer is full."""
        ready = self.ready
        consumers = self._consumers
        count = len(consumers)
        if not ready or not count:
            return
        uri = self.uri
        turn = self._next
        delivered: list[DeliveryUpdate] = []
        pushes: list[PendingPush] = []
        while ready:
            for _ in range(count):
                consumer = consumers[turn]
                turn = turn + 1 if turn + 1 < count else 0
                if consumer.has_room():
                    break
            else:
                break
            message = ready.popleft()
            message.delivery_count += 1
            consumer.unconfirmed[message.guid] = message
            consumer.unconfirmed_bytes += len(message.payload)
            pushes.append((consumer, message, message.delivery_count))
            delivered.append(DeliveryUpdate(uri, message.guid, message.delivery_count))
        self._next = turn
        if delivered:
            self.pushed += len(delivered)
            self._updates.delivered(delivered, pushes)


@dataclass(slots=True, eq=False)
class QueueHandle:
    """A queue as one session opened it, under the session's ``queue_id``."""

    queue_id: int
    queue: Queue
    read: bool
    write: bool
    consumer: Consumer | None
    """Set when opened with read."""


class QueueRegistry:
    """All queues of the broker, by URI, created on first use."""

    def __init__(
        self,
        store: Store,
        dedup_window: float = DEFAULT_WINDOW,
        dedup_max_guids: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        dedup_grace: float = DEFAULT_GRACE,
    ) -> None:
        self._queues: dict[str, Queue] = {}
        self._dedup_window = dedup_window
        self._dedup_grace = dedup_grace
        self.budget = HistoryBudget(
            default_max_guids() if dedup_max_guids is None else dedup_max_guids
        )
        """The GUIDs all queues' histories hold, against the broker's bound."""
        self._clock = clock
        self.updates = Updates(store)

    def __iter__(self) -> Iterator[Queue]:
        return iter(self._queues.values())

    def __len__(self) -> int:
        return len(self._queues)

    def get(self, uri: str) -> Queue | None:
        """The queue at ``uri`` if it exists."""
        return self._queues.get(uri)

    def open(self, uri: str) -> Queue:
        """The queue at ``uri``, created empty if it does not exist yet."""
        queue = self._queues.get(uri)
        if queue is None:
            history = GuidHistory(
                self._dedup_window, self._dedup_grace, self.budget, self._clock, uri
            )
            queue = self._queues[uri] = Queue(uri, history, self.updates)
        return queue

    def restore(self, state: RecoveredState) -> tuple[int, int]:
        """Load what a store recovered: ready messages (in order) and GUID history.
        Returns (messages, history entries kept)."""
        messages = 0
        for uri, ready in state.queues.items():
            self.open(uri).enqueue(ready)
            messages += len(ready)
        kept = 0
        for entry in state.history:
            queue = self.open(entry.queue_uri)
            queue.history.record(entry.guid, entry.digest, entry.accepted_at)
            kept += entry.guid in queue.history
        return messages, kept

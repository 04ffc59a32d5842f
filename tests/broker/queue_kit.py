"""A memory-store ``Queue`` on its own for rule tests: a settable clock, PUSHes and
store updates recorded at once (no event loop, no store), and a graveyard that records
what it buries."""

from __future__ import annotations

from holdfast.broker.consumers import Consumer, FlowLimits
from holdfast.broker.dedup import GuidHistory
from holdfast.broker.queues import Queue
from holdfast.broker.store import NO_PROPERTIES, MemoryStore, StoredMessage
from holdfast.broker.updates import PendingPush, Updates
from holdfast.proto.policy import PICKUP_TTL


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Sink:
    """PUSHes as (consumer id, guid, delivery count), in order."""

    def __init__(self) -> None:
        self.pushed: list[tuple[int, bytes, int]] = []

    def push(self, queue_id: int, message: StoredMessage, delivery_count: int) -> None:
        self.pushed.append((queue_id, message.guid, delivery_count))

    def revoke(self, queue_id: int, guids: list[bytes]) -> None:
        raise AssertionError("only a Redis node that lost its lease revokes deliveries")


class SyncUpdates(Updates):
    """PUSHes leave at once; removals and count updates are recorded."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.removals: list[bytes] = []
        self.counts: list[tuple[bytes, int]] = []

    def removed(self, queue_uri: str, guid: bytes) -> None:
        self.removals.append(guid)

    def removed_run(self, queue_uri: str, guids: list[bytes]) -> None:
        self.removals += guids

    def delivered(self, queue_uri: str, pushes: list[PendingPush]) -> None:
        self.counts += [(message.guid, count) for _, message, count in pushes]
        for consumer, message, count in pushes:
            consumer.sink.push(consumer.queue_id, message, count)


class Graveyard:
    def __init__(self) -> None:
        self.buried: list[tuple[bytes, str]] = []

    def bury(self, queue: Queue, dead: list[tuple[StoredMessage, str]]) -> None:
        for message, reason in dead:
            self.buried.append((message.guid, reason))
            queue.forget(message)


def msg(
    guid: bytes, size: int = 4, at: float = 100.0, pickup_ms: int | None = None
) -> StoredMessage:
    properties = NO_PROPERTIES if pickup_ms is None else {PICKUP_TTL: str(pickup_ms)}
    return StoredMessage("hf://t/q", guid, b"x" * size, properties, at)


def make(graveyard: Graveyard | None = None) -> tuple[Queue, Clock, SyncUpdates]:
    clock = Clock()
    updates = SyncUpdates()
    timed: set[Queue] = set()
    # The history keeps its own (real) clock: the queue's rules must read the queue's.
    queue = Queue("hf://t/q", GuidHistory(), updates, graveyard, clock, timed)
    return queue, clock, updates


def consumers(sink: Sink, n: int, room: int = 100) -> list[Consumer]:
    return [Consumer(i, sink, FlowLimits(max_messages=room)) for i in range(n)]

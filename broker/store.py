"""The storage interface of the broker, and the in-memory store.

The broker keeps every queue in memory and uses a ``Store`` only to make its
changes durable and to get them back after a restart:

* at start, ``recover()`` returns the ready messages of every queue, in delivery
  order, the GUID history (what was accepted, when, and its content digest) so that
  dedup keeps working across a restart, and the broker-clock time to resume from;
* while running, the broker hands the store ``StoreBatch`` es through ``write()``:
  new messages (awaited before their PUTs are ACKed), delivery-count updates
  (awaited before the PUSHes that carry the new counts leave, so a count survives a
  kill -9), confirmed messages (not awaited), queue policies and deleted queues; a
  message that moves to a dead-letter queue is one batch (its removal and its new
  copy), so a crash leaves it in exactly one of the two queues; the messages a
  transactional write's commit publishes carry its ``CommitRecord`` in their batch, so
  a crash cannot leave them stored without the record that the commit happened;

Times (``accepted_at``) are on the broker's clock (``dedup.BrokerClock``: monotonic,
resumed at restart from ``RecoveredState.resume_at``), never the wall clock.
* at stop, ``close()``.

``MemoryStore`` persists nothing: its state is the broker's queues, so it dies
with the process. ``SqliteStore`` (``sqlite_store``) implements the same names
durably. A store that cannot be opened or read raises ``StoreError``. Which store a
``--store`` value names is decided in ``stores``, apart from this interface.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from holdfast.proto.policy import PICKUP_TTL, QueuePolicy

NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
"""The shared, read-only properties of a message that has none."""


class StoreError(Exception):
    """A store cannot be opened, read or written. The message names the store's
    location and the problem, in one line fit for a user."""


@dataclass(slots=True, eq=False)
class StoredMessage:
    """One accepted message: the broker's queues hold these, and stores persist them.

    ``delivery_count`` is how many times the message has been PUSHed so far: 0 while
    it has never been delivered; a PUSH carries the count after incrementing it.
    """

    queue_uri: str
    guid: bytes
    payload: bytes
    properties: Mapping[str, str]
    accepted_at: float
    """Broker-clock time (``dedup.BrokerClock``) at which the broker accepted the PUT."""
    delivery_count: int = 0
    digest: int = 0
    """``dedup.content_digest`` of payload and properties: a replay under this GUID
    with another digest is a CONFLICT."""

    def pickup_deadline(self) -> float | None:
        """When its pickup TTL (``x-ttl-ms``) ends, on the broker clock; None without one."""
        ttl_ms = self.properties.get(PICKUP_TTL) if self.properties else None
        return None if ttl_ms is None else self.accepted_at + int(ttl_ms) / 1000


class HistoryEntry(NamedTuple):
    """A GUID the broker accepted on a queue, when (broker clock), and the digest of
    its content (``dedup.content_digest``)."""

    queue_uri: str
    guid: bytes
    accepted_at: float
    digest: int


class MessageKey(NamedTuple):
    """Names one message: its queue and its GUID."""

    queue_uri: str
    guid: bytes


class DeliveryUpdate(NamedTuple):
    """A message's new delivery count (it was PUSHed once more)."""

    queue_uri: str
    guid: bytes
    delivery_count: int


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """A transactional write's commit (``staging_service``), stored in the same
    transaction as the messages it publishes: after a crash between that write and the
    commit mark (kept apart, in ``marks``), the broker finds the record at start and
    completes the commit instead of leaving it to be published again."""

    queue_uri: str
    app_id: str
    version: int
    digest: bytes
    rows: int
    """The row count the writer reported (the commit mark's)."""
    attempts: tuple[tuple[int, int, int], ...] = ()
    """The committed attempts: (partition, attempt, rows staged)."""


@dataclass(slots=True)
class StoreBatch:
    """Changes to make durable together.

    A store must apply batches in the order ``write()`` was called. Every new
    message is also a GUID history entry (``queue_uri, guid, accepted_at, digest``)
    and stays in the history after it is removed, until the dedup window plus grace
    has passed.
    """

    messages: list[StoredMessage] = field(default_factory=list)
    """Newly accepted messages, appended to their queues in this order."""
    removed: list[MessageKey] = field(default_factory=list)
    """Confirmed messages: no longer in their queue."""
    delivered: list[DeliveryUpdate] = field(default_factory=list)
    """Messages whose delivery count changed."""
    policies: list[tuple[str, QueuePolicy]] = field(default_factory=list)
    """Queue policies set (``policy.NO_POLICY`` clears one), applied after the rest."""
    deleted: list[str] = field(default_factory=list)
    """Queues deleted by an operator: their messages, history and policy go, last."""
    commit: CommitRecord | None = None
    """The commit that published ``messages`` (or found them all stored already):
    recorded with them, replacing the application's previous record on that queue."""
    forgotten: list[CommitRecord] = field(default_factory=list)
    """Commit records no longer needed (their commit marks are durable): deleted."""

    def __bool__(self) -> bool:
        return bool(
            self.messages
            or self.removed
            or self.delivered
            or self.policies
            or self.deleted
            or self.commit is not None
            or self.forgotten
        )


@dataclass(frozen=True, slots=True)
class RecoveredState:
    """What a store holds at start: queues and the GUID history."""

    queues: Mapping[str, Sequence[StoredMessage]] = field(default_factory=dict)
    """Queue URI -> its ready (unconfirmed) messages in delivery order, with their
    delivery counts. A queue with no message may be listed with an empty sequence."""
    history: Sequence[HistoryEntry] = ()
    """Accepted GUIDs in acceptance order; entries older than the dedup window plus
    grace may be included (the broker drops them)."""
    resume_at: float = 0.0
    """The latest broker-clock time the store persisted: the broker's clock resumes
    from it, so downtime does not age the history."""
    history_complete_since: float | None = None
    """Broker-clock time after which every accepted GUID is in ``history`` (what the
    store pruned before it, under the window it ran with then); None: no limit known.
    A broker restarted with a longer window vouches only for what this covers, until
    its own time fills the difference (``PutPipeline``)."""
    policies: Mapping[str, QueuePolicy] = field(default_factory=dict)
    """Queue URI -> the policy an operator set on it."""
    commits: Sequence[CommitRecord] = ()
    """Commit records not yet forgotten: their messages are stored, their commit marks
    may be missing (the broker completes each at start, then forgets it)."""


class Store(Protocol):
    """Where the broker makes its state durable. Every method runs on the broker's
    event loop thread; a store that blocks must move that work to a thread of its own.
    """

    def recover(self) -> RecoveredState:
        """Return the state to start from. Called once, before any ``write()``."""
        ...

    def write(self, batch: StoreBatch) -> Awaitable[None]:
        """Take ``batch`` now (batches are applied in call order) and return an
        awaitable that completes once the batch is durable, or raises if it could not
        be made durable (nothing of it then counts as stored).

        The broker awaits it before it ACKs the batch's PUTs and enqueues their
        messages. For batches of only removals and delivery updates it does not wait,
        but it does consume the result, so the awaitable must not need awaiting to
        make progress.
        """
        ...

    def close(self) -> None:
        """Release the store; called once, at stop, after the last ``write()``.
        Batches already taken are made durable (or failed) before it returns."""
        ...


class Completed:
    """An awaitable that is already done: what a store returns for work it finished
    synchronously, without creating a future per batch."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # makes this a generator that finishes at once


COMPLETED = Completed()
"""The shared already-done awaitable."""


class MemoryStore:
    """A ``Store`` that keeps nothing: queues live only in the broker's memory, so a
    restart starts empty (and forgets the GUID history)."""

    def recover(self) -> RecoveredState:
        """Nothing was kept: an empty state."""
        return RecoveredState()

    def write(self, batch: StoreBatch) -> Awaitable[None]:
        """Nothing to persist: the batch is as durable as it will get."""
        return COMPLETED

    def close(self) -> None:
        """Nothing to release."""


async def settle(result: Awaitable[None]) -> None:
    """Await a store result whose outcome nobody waits for, so that it completes and its
    failure is raised here (for the caller to log) rather than lost."""
    if not isinstance(result, Completed):
        await result


def settle_futures(futures: list[asyncio.Future[None]], error: StoreError | None) -> None:
    """On the loop: complete each write's future with ``error`` or success (one whose
    awaiter gave up is skipped): how a store that writes on a thread of its own reports."""
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


__all__ = [
    "COMPLETED",
    "NO_PROPERTIES",
    "CommitRecord",
    "Completed",
    "DeliveryUpdate",
    "HistoryEntry",
    "MemoryStore",
    "MessageKey",
    "RecoveredState",
    "Store",
    "StoreBatch",
    "StoreError",
    "StoredMessage",
    "settle",
    "settle_futures",
]

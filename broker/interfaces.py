"""What the broker's session, server and metrics call on a store's queues.

Two stores' worth of queues stand behind these: the broker's own (``registry``,
``queues``, ``puts``: memory and sqlite) and the Redis store's (``redis.registry``,
``redis.queues``, ``redis.puts``). Each satisfies them structurally (mypy checks it
where the broker hands them to a session or a collector), so neither imports this
module, and this module imports neither: the interfaces stay apart from what
implements them and from what picks an implementation (``server``).

A session is generic in its store's queue type: the PUT path reads its own queues
through the handles the session opened (``QueueHandle[Q]``), so the registry that
opens them and the PUT path that reads them must agree on ``Q``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from holdfast.broker.consumers import Consumer, QueueHandle
    from holdfast.broker.writer import Writer
    from holdfast.proto.columns import PutColumns
    from holdfast.server.outbox import Outbox
    from holdfast.server.spans import AcceptSpans


class SessionQueue(Protocol):
    """One queue as a session uses it: handles counted, consumers attached and
    detached, their deliveries confirmed and rejected."""

    @property
    def uri(self) -> str:
        """The queue's URI."""
        ...

    handles: int
    """Queue handles open on it (the session counts its own in and out)."""

    @property
    def consumers(self) -> Sequence[Consumer]:
        """The consumers attached (on this broker node)."""
        ...

    def attach(self, consumer: Consumer) -> None:
        """Start delivering to ``consumer``."""
        ...

    def detach(self, consumer: Consumer, redeliver: bool = True) -> int:
        """Stop delivering to ``consumer``; what it held goes back to the queue (and is
        delivered again at once unless ``redeliver`` is false). Returns how many."""
        ...

    def confirm(self, consumer: Consumer, guid: bytes) -> bool:
        """Remove ``guid``, delivered to ``consumer``; False if it does not hold it."""
        ...

    def confirm_run(self, consumer: Consumer, guids: list[bytes]) -> list[bytes]:
        """``confirm`` each of ``guids``, in order; the GUIDs ``consumer`` does not hold."""
        ...

    def reject(self, consumer: Consumer, guid: bytes, requeue: bool, delay: float) -> bool:
        """Give ``guid`` back (requeued after ``delay`` seconds, or dead-lettered);
        False if ``consumer`` does not hold it."""
        ...

    def deliver(self) -> None:
        """PUSH what the consumers have room for."""
        ...


Q = TypeVar("Q", bound=SessionQueue)
"""A store's queue type, as one session's registry and PUT path share it."""

Q_co = TypeVar("Q_co", bound=SessionQueue, covariant=True)
"""A store's queue type, where it is only handed out."""


class SessionQueues(Protocol[Q_co]):
    """The queues of a store, by URI, as a session opens and looks them up."""

    def now(self) -> float:
        """Seconds on the clock the messages' acceptance times are on."""
        ...

    def get(self, uri: str) -> Q_co | None:
        """The queue at ``uri``, if this broker has it."""
        ...

    def open(self, uri: str) -> Q_co:
        """The queue at ``uri``, created (or listed) on first use."""
        ...

    def count_consumers(self, uri: str, answer: Callable[[int], None]) -> None:
        """Call ``answer`` with the consumers of ``uri`` that deliveries may go to (0
        for a queue never opened); at once or later, as the store can."""
        ...


class PutPath(Protocol[Q]):
    """Where a session's PutBatch frames go."""

    def on_put_batch(
        self,
        puts: PutColumns,
        handles: Mapping[int, QueueHandle[Q]],
        outbox: Outbox,
        writer: Writer,
        spans: AcceptSpans | None = None,
    ) -> None:
        """Store and enqueue one frame's PUTs to the session's open ``handles``; their
        ACKs go to ``outbox`` in PUT order once final. Writes made on the client's
        behalf elsewhere (a redirect, a dead-letter notice) are checked against
        ``writer``. ``spans`` end with the final ACKs."""
        ...


class MetricsQueue(Protocol):
    """One queue's counters and depths, as the metrics collector reads them (from the
    HTTP server's thread: reads only)."""

    @property
    def uri(self) -> str:
        """The queue's URI."""
        ...

    @property
    def accepted(self) -> int:
        """PUTs accepted into it."""
        ...

    @property
    def pushed(self) -> int:
        """PUSHes of its messages, redeliveries included."""
        ...

    @property
    def redelivered(self) -> int:
        """PUSHes of messages delivered before."""
        ...

    @property
    def dedup_hits(self) -> int:
        """Replayed PUTs ACKed without enqueuing."""
        ...

    @property
    def rejected(self) -> int:
        """Messages consumers rejected."""
        ...

    @property
    def dead(self) -> Counter[str]:
        """Messages that left for the dead-letter queue (or were dropped), by reason."""
        ...

    @property
    def ready(self) -> Sized:
        """Its ready messages (only their count is read)."""
        ...

    @property
    def live_bytes(self) -> int:
        """Payload bytes of its messages."""
        ...

    @property
    def consumers(self) -> Sequence[Consumer]:
        """The consumers attached (their unconfirmed deliveries are counted)."""
        ...

    def oldest_accepted_at(self) -> float | None:
        """When its oldest message was accepted; None if empty or not known here."""
        ...


class DroppedCounts(Protocol):
    """A graveyard's count of dead messages dropped for want of a dead-letter queue."""

    @property
    def dropped(self) -> Counter[str]:
        """Dropped dead messages, by reason."""
        ...


class MetricsQueues(Protocol):
    """The queues the metrics collector walks at each scrape."""

    def __iter__(self) -> Iterator[MetricsQueue]: ...

    @property
    def graveyard(self) -> DroppedCounts:
        """Where the queues' dead messages went."""
        ...


class StagedCounts(Protocol):
    """What the staging metrics read: a ``StagingBook``, or a Redis node's
    ``RedisStaging`` (its counters are that node's, its total the last sweep's)."""

    @property
    def staged_total(self) -> int:
        """Rows staged now."""
        ...

    @property
    def expired_rows(self) -> int:
        """Staged rows discarded at their deadline."""
        ...

    @property
    def discarded_rows(self) -> int:
        """Staged rows discarded by a commit of another attempt or an abort."""
        ...


__all__ = [
    "DroppedCounts",
    "MetricsQueue",
    "MetricsQueues",
    "PutPath",
    "Q",
    "Q_co",
    "SessionQueue",
    "SessionQueues",
    "StagedCounts",
]

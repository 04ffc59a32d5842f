"""The GUID history of one queue: which GUIDs it accepted, with a digest of their content.

A PUT whose GUID is in the history is a replay (a client retransmitting after a
connection failure, a Spark task retried): the broker ACKs it with success and does
not enqueue it again, or answers CONFLICT if its content digest differs.

How long an entry lives
-----------------------

The broker announces a window W (``dedup_window``) and refuses, with TOO_OLD, a PUT
of an unknown GUID whose ``age_ms`` is past W. ``age_ms`` is the PUT's age when the
last hop *sent* it; the time the frame then spends in flight (network, gRPC and
socket buffers, a session whose reading is paused by its read bound) is not in it.
So an entry is kept for W plus a grace G (``dedup_grace``, default 30 s) after the
broker accepted it: a replay sent at age <= W and delayed in flight by up to G
still finds its original. Expiry happens per bucket of ``(W + G) / 128`` seconds,
so an entry may outlive W + G by one bucket (longer is safe, never shorter).

Nothing is evicted early. Memory is bounded instead by a broker-wide
``HistoryBudget``: once it holds ``max_guids`` GUIDs, new PUTs are refused with
HISTORY_FULL (the SDK keeps them and retries) until entries expire.

Clock
-----

Ages are measured on a ``BrokerClock``: ``time.monotonic()`` plus an offset, never the
wall clock, so a step of the wall clock (NTP, an operator) changes nothing while the
broker runs. A durable store persists acceptance times in that clock; at restart the
clock resumes from the latest persisted time (``BrokerClock.resume``). Downtime is
therefore not counted: after a restart every recovered entry is kept at least as
long as it had left, never shorter, whatever the wall clock did meanwhile (a forward
step while down cannot expire anything). The cost is that a history outlives its
window by the broker's downtime, which the budget bounds.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from collections.abc import Callable, Mapping

from holdfast.broker.guidtable import MAX_GENERATIONS, PackedGuids
from holdfast.proto.limits import DEFAULT_DEDUP_WINDOW

DEFAULT_WINDOW = DEFAULT_DEDUP_WINDOW
"""Seconds a GUID is remembered (the contract's default, ``holdfast.proto.limits``)."""

DEFAULT_GRACE = 30.0
"""Seconds an entry is kept past the window: covers the in-flight time of a PUT between
the last hop's send (where its ``age_ms`` was set) and the broker. 30 s is well above a
link's latency and gRPC buffering, and above a session's read pause (its outbox drains
at link speed); it costs 10% more history at the default window."""

MAX_GRACE = 86_400.0
"""The longest grace a broker takes (``--dedup-grace``): a day. The grace covers a PUT's
seconds in flight, so a day is already history kept for nothing; bounded so that window
plus grace stays a finite number of milliseconds where the stores keep it (an infinite
one failed the Redis store's ``round(retention * 1000)``)."""

BYTES_PER_GUID_ESTIMATE = 32
"""What one held GUID costs in this implementation at most (``make bench`` measures it:
a 25-byte packed record and a 1-byte fingerprint, ``holdfast.broker.guidtable``, and
its partition's share of two bytearray headers and their spare room)."""

DEFAULT_MAX_GUIDS = 33_000_000
"""Broker-wide bound on the GUIDs held by all histories: about 1 GB at
``BYTES_PER_GUID_ESTIMATE``, which covers the whole default window with its grace
(330 s) at 100k msg/s. Above that rate producers get HISTORY_FULL and wait, and
nothing is forgotten (``--history-max-guids`` or ``$HOLDFAST_HISTORY_MAX_GUIDS``)."""

MAX_GUIDS_ENV = "HOLDFAST_HISTORY_MAX_GUIDS"
"""Environment variable that overrides ``DEFAULT_MAX_GUIDS``."""

BUCKETS_PER_SPAN = 128
"""Expiry granularity: the retention span is cut into this many buckets."""


def default_max_guids() -> int:
    """``$HOLDFAST_HISTORY_MAX_GUIDS`` if set (a positive integer), else the default."""
    text = os.environ.get(MAX_GUIDS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_GUIDS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{MAX_GUIDS_ENV} must be a whole number > 0, got {text[:40]!r}")
    return value


def content_digest(payload: bytes, properties: Mapping[str, str]) -> int:
    """A stable 64-bit digest (signed, so SQLite stores it as an INTEGER) of a message's
    payload and properties; properties are canonical: sorted, length-prefixed."""
    digest = hashlib.blake2b(payload, digest_size=8)
    if properties:
        # One update of the joined parts: the same digest as an update per part (a
        # hash is a stream), without four calls into hashlib per property.
        parts: list[bytes] = []
        for key in sorted(properties):
            value = properties[key].encode()
            encoded = key.encode()
            parts += (
                len(encoded).to_bytes(4, "big"),
                encoded,
                len(value).to_bytes(4, "big"),
                value,
            )
        digest.update(b"".join(parts))
    return int.from_bytes(digest.digest(), "big", signed=True)


class BrokerClock:
    """Seconds on the broker's own clock: monotonic, resumable after a restart."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._offset = -monotonic()

    def __call__(self) -> float:
        return self._monotonic() + self._offset

    def resume(self, at: float) -> None:
        """Continue from ``at`` (the latest time a store persisted) if that is later than
        now, so times persisted by an earlier run never lie in the future."""
        now = self()
        if at > now:
            self._offset += at - now


class HistoryBudget:
    """How many GUIDs all histories of a broker may hold, and hold now."""

    __slots__ = ("held", "max_guids", "reserved")

    def __init__(self, max_guids: int) -> None:
        if max_guids <= 0:
            raise ValueError("the history bound must be > 0 GUIDs")
        self.max_guids = max_guids
        self.held = 0
        """GUIDs in histories."""
        self.reserved = 0
        """Fresh PUTs taken and not yet recorded (their store write is pending)."""

    def full(self) -> bool:
        """Whether a new GUID must be refused."""
        return self.held + self.reserved >= self.max_guids


class GuidHistory:
    """The GUIDs (and content digests) a queue accepted in the last window + grace.

    Held packed (``holdfast.broker.guidtable``): under 32 B per GUID. Each time bucket
    is a generation of the table; a bucket is ``[expiry, generation, GUID count]``.
    """

    def __init__(
        self,
        window: float = DEFAULT_WINDOW,
        grace: float = DEFAULT_GRACE,
        budget: HistoryBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "",
    ) -> None:
        if window <= 0:
            raise ValueError("the dedup window must be > 0 seconds")
        if grace < 0:
            raise ValueError("the dedup grace must be >= 0 seconds")
        self.window = window
        self.grace = grace
        self.retention = window + grace
        """Seconds an entry is kept at least."""
        self.name = name
        self.budget = budget if budget is not None else HistoryBudget(DEFAULT_MAX_GUIDS)
        self._clock = clock
        self._width = self.retention / BUCKETS_PER_SPAN
        self._table = PackedGuids()
        self.get: Callable[[bytes], int | None] = self._table.get
        """The content digest of ``guid`` if the history holds it (the table's own
        method: a lookup per PUT does not pay for a second call)."""
        self._count = 0
        # [time the bucket's entries all expire, its generation, its GUID count],
        # oldest first.
        self._buckets: deque[list[float]] = deque()

    def __contains__(self, guid: object) -> bool:
        return isinstance(guid, bytes) and self._table.get(guid) is not None

    @property
    def clock(self) -> Callable[[], float]:
        """The clock entries are timed on (the broker's)."""
        return self._clock

    def clear(self) -> None:
        """Forget every entry (the queue was deleted by an operator)."""
        self.budget.held -= self._count
        self._count = 0
        self._buckets.clear()
        self._table.clear()

    def __len__(self) -> int:
        return self._count

    def record(self, guid: bytes, digest: int, accepted_at: float, known_new: bool = False) -> None:
        """Remember ``guid`` as accepted at ``accepted_at`` (broker clock). An entry whose
        retention has already passed is not kept. Entries are recorded in acceptance
        order; an earlier time than the last bucket's joins it (kept longer).
        ``known_new``: the caller knows the history does not hold ``guid`` (the broker
        admitted its PUT after looking it up), so it is not looked up again."""
        if not self._bucket_for(accepted_at):
            return
        if not self._table.add(guid, digest, known_new):
            return
        self._buckets[-1][2] += 1
        self._count += 1
        self.budget.held += 1

    def record_new(self, guids: list[bytes], digests: list[int], accepted_at: float) -> None:
        """``record(..., known_new=True)`` for a whole PUT batch accepted at one time:
        the bucket is chosen once and the GUIDs join the table together (the broker
        admitted each after a lookup that missed, and ``in_flight`` kept it unique).
        With many open queues a frame brings each queue one or two GUIDs, so this path
        is per queue as much as per GUID: it makes no lists and one table call."""
        count = len(guids)
        if not count or not self._bucket_for(accepted_at):
            return
        if count == 1:
            self._table.add(guids[0], digests[0], True)
        else:
            self._table.add_new(guids, digests)
        self._buckets[-1][2] += count
        self._count += count
        self.budget.held += count

    def _bucket_for(self, accepted_at: float) -> bool:
        """Make the last bucket the one for entries accepted at ``accepted_at``; False if
        their retention has already passed (they are not kept)."""
        expires = accepted_at + self.retention
        if expires <= self._clock():
            return False
        buckets = self._buckets
        if not buckets or expires > buckets[-1][0]:
            table = self._table
            if len(buckets) < MAX_GENERATIONS:
                # The bucket's expiry is the latest any of its entries may need.
                generation = table.newest + 1
                table.begin(generation)
                if not buckets:
                    table.oldest = generation
                buckets.append([expires + self._width, generation, 0])
            else:
                # Times far apart (a clock resumed far ahead): the last bucket is kept
                # longer rather than a generation tag be reused while alive.
                buckets[-1][0] = expires + self._width
        return True

    def expire(self, now: float | None = None) -> int:
        """Drop the buckets whose retention has passed at ``now``; how many GUIDs went."""
        buckets = self._buckets
        if not buckets:
            return 0
        if now is None:
            now = self._clock()
        if buckets[0][0] > now:
            return 0
        dropped = generations = 0
        while buckets and buckets[0][0] <= now:
            dropped += int(buckets.popleft()[2])
            generations += 1
        table = self._table
        if buckets:
            table.oldest = int(buckets[0][1])
            table.sweep(generations)
        else:
            table.clear()
        self._count -= dropped
        self.budget.held -= dropped
        return dropped


class HistoryCover:
    """The oldest PUT age the history vouches for: the window, except after a restart
    on a store pruned under a shorter window (the operator raised ``--dedup-window``).
    Such a store holds only the GUIDs accepted after its last pruned row
    (``RecoveredState.history_complete_since``); an unknown GUID older than that may
    have been forgotten, so it is TOO_OLD until the broker's own time has filled the
    window again. A replay of age ``a`` sent at ``now`` was first accepted no earlier
    than ``now - a - grace`` (the grace covers its time in flight), so the history
    holds it when that is after the complete-since time."""

    def __init__(self, window: float, grace: float) -> None:
        self.window_ms = round(window * 1000)
        self._grace = grace
        self._since: float | None = None

    def recovered(self, complete_since: float | None) -> None:
        """The store's history is complete after ``complete_since`` (None: wholly)."""
        self._since = complete_since

    def max_age_ms(self, now: float) -> int:
        """PUTs of unknown GUIDs older than this (ms) at ``now`` are TOO_OLD."""
        since = self._since
        if since is None:
            return self.window_ms
        covered = int((now - self._grace - since) * 1000)
        if covered >= self.window_ms:
            self._since = None  # filled: the window holds from now on
            return self.window_ms
        return max(covered, 0)

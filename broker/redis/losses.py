"""Finding and reporting what a Redis store lost.

Every PUT, claim and confirm script moves its queue's write sequence
(``hf:{uri}:seq``) on by one and returns it; the node keeps the highest it saw per
queue, and when (``SeqBook``). Every beat it reads the sequences of the queues it
wrote in the last ``SPAN`` seconds back (one pipeline per 500 queues): one that is
lower than what the node saw means Redis went back in time for that queue —
restarted from an older snapshot, failed over to a replica that lagged, flushed —
and everything the node wrote there after that value is gone. The lease keeper's
mark and ``hf:generation`` catch the same for the node as a whole (``lease``).

What the node can count is what it ACKed SUCCESS itself since then: the journal
keeps those counts per queue and per second for the last ``SPAN`` seconds. The
report names the queues with their counts; messages ACKed by other nodes are counted
by those nodes' own reports.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

SPAN = 3600
"""Seconds of ACK counts and write sequences the node keeps."""

DELETED_SEQ_TTL = 2 * SPAN
"""Seconds a deleted queue's write sequence stays in Redis (``admin_scripts.DELETE``):
longer than any node keeps a sequence it saw (``SPAN``, from a reply that may reach it
late), so no node reads the deleted queue's sequence as one that went back."""


@dataclass(frozen=True, slots=True)
class DataLoss:
    """A loss the node found: its one-line report and the queues it knows were hit
    (with how many of their messages it had ACKed SUCCESS since the lost moment)."""

    message: str
    queues: dict[str, int]


class _Second:
    """One second's value of a queue (an ACK count, or the highest write sequence)."""

    __slots__ = ("second", "value")

    def __init__(self, second: int, value: int) -> None:
        self.second = second
        self.value = value


class _PerSecond:
    """The values of one queue, one per second at most, for ``SPAN`` s."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: deque[_Second] = deque()

    def add(self, second: int, value: int, keep_max: bool) -> None:
        entries = self.entries
        if entries and entries[-1].second == second:
            last = entries[-1]
            last.value = max(last.value, value) if keep_max else last.value + value
        else:
            entries.append(_Second(second, value))
            while entries[0].second <= second - SPAN:
                entries.popleft()


class AckJournal:
    """SUCCESS ACKs of this node per queue, per second, for the last ``SPAN`` s."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._queues: dict[str, _PerSecond] = {}

    def record(self, uri: str, acked: int) -> None:
        """``acked`` PUTs to ``uri`` were just ACKed SUCCESS."""
        self._queues.setdefault(uri, _PerSecond()).add(math.floor(self._clock()), acked, False)

    def since(self, uri: str, moment: float, until: float = math.inf) -> int:
        """ACKs to ``uri`` from ``moment`` on, to ``until`` (the seconds they fall in
        included)."""
        book = self._queues.get(uri)
        first, last = math.floor(moment), until if until == math.inf else math.floor(until)
        if book is None:
            return 0
        return sum(e.value for e in book.entries if first <= e.second <= last)

    def queues_since(self, moment: float, until: float = math.inf) -> dict[str, int]:
        """ACKs per queue from ``moment`` to ``until``, for the queues that had any."""
        counts = {uri: self.since(uri, moment, until) for uri in list(self._queues)}
        return {uri: n for uri, n in counts.items() if n}


class SeqBook:
    """The write sequences this node saw per queue, with the second it saw each."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._queues: dict[str, _PerSecond] = {}

    def saw(self, uri: str, seq: int) -> None:
        """A script on ``uri`` returned the write sequence ``seq``. A lower one than the
        node saw is kept out (it is what the loss check is to find, not a new high)."""
        book = self._queues.setdefault(uri, _PerSecond())
        if book.entries and seq < book.entries[-1].value:
            return
        book.add(math.floor(self._clock()), seq, True)

    def highest(self, uri: str) -> int:
        """The highest write sequence seen for ``uri`` (0 if none)."""
        book = self._queues.get(uri)
        return 0 if book is None else book.entries[-1].value

    def queues(self) -> list[str]:
        """The queues seen in the last ``SPAN`` seconds (older ones are forgotten)."""
        oldest = math.floor(self._clock()) - SPAN
        for uri in [u for u, book in self._queues.items() if book.entries[-1].second <= oldest]:
            del self._queues[uri]
        return list(self._queues)

    def went_back(self, uri: str, stored: int, seen: int) -> float | None:
        """If Redis holds ``stored`` for ``uri`` but the node had seen ``seen``, more,
        before it read that: the second from which the node's writes there are lost
        (then the book adopts ``stored``); None if nothing went back."""
        book = self._queues.get(uri)
        if book is None or stored >= seen:
            return None
        # None once another check (the lease keeper's, beside the beat's) adopted it.
        lost_from = next((e.second for e in book.entries if e.value > stored), None)
        if lost_from is None:
            return None
        book.entries.clear()
        book.entries.append(_Second(math.floor(self._clock()), stored))
        return float(lost_from)


RECENT = 50_000
"""Deliveries and confirms the node remembers for a repair (about 5 MB)."""


class RecentWork:
    """The node's latest deliveries (with their counts) and confirms, per queue: what
    it re-applies when Redis went back in time (``REPAIR``), so that a message a
    consumer confirmed is not delivered again and no delivery count goes back."""

    def __init__(self) -> None:
        self._entries: deque[tuple[str, bytes, int]] = deque(maxlen=RECENT)

    def delivered(self, uri: str, guid: bytes, count: int) -> None:
        """``guid`` of ``uri`` was delivered for the ``count``-th time."""
        self._entries.append((uri, guid, count))

    def confirmed(self, uri: str, guid: bytes) -> None:
        """``guid`` of ``uri`` was confirmed (count 0 marks a confirm)."""
        self._entries.append((uri, guid, 0))

    def of(self, uri: str) -> tuple[dict[bytes, int], list[bytes]]:
        """The highest delivery count seen per GUID of ``uri``, and its confirmed GUIDs."""
        counts: dict[bytes, int] = {}
        confirmed: list[bytes] = []
        for queue, guid, count in list(self._entries):
            if queue != uri:
                continue
            if count == 0:
                confirmed.append(guid)
            elif count > counts.get(guid, 0):
                counts[guid] = count
        return counts, confirmed


def describe(where: str, why: str, acked: dict[str, int], covered: bool) -> DataLoss:
    """The LOST DATA report: why, and what the node ACKed since the lost moment."""
    total = sum(acked.values())
    ranked = sorted(acked.items(), key=lambda item: -item[1])
    shown = ", ".join(f"{uri} ({n})" for uri, n in ranked[:5])
    more = f" and {len(acked) - 5} more queues" if len(acked) > 5 else ""
    bound = "up to" if covered else "at least"
    counted = (
        f"{bound} {total} messages this node ACKed SUCCESS since then may be gone"
        + (f": {shown}{more}" if acked else "")
        + ("" if covered else f" (it counts only the last {SPAN} s)")
    )
    message = (
        f"redis store {where} LOST DATA: {why}; {counted}; messages confirmed since then "
        "may be delivered again, and replays inside the dedup window may be taken again"
    )
    return DataLoss(message, dict(acked))


__all__ = [
    "DELETED_SEQ_TTL",
    "RECENT",
    "SPAN",
    "AckJournal",
    "DataLoss",
    "RecentWork",
    "SeqBook",
    "describe",
]

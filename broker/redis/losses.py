"""What a node can say when Redis loses data: which queues, how many messages.

Redis that goes back in time (``lease.StoreWentBack``) has lost every write made
after some moment, and the node cannot read back what is gone. What it can count is
what it ACKed SUCCESS itself since then: the journal keeps those counts per queue and
per second of the lease keeper's clock, for the last ``SPAN`` seconds (a few KiB per
busy queue and hour). The loss report names them; messages ACKed by other nodes are
counted by those nodes' own reports.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

SPAN = 3600
"""Seconds of ACK counts the journal keeps."""


@dataclass(frozen=True, slots=True)
class DataLoss:
    """A loss the node found: its one-line report and the queues it knows were hit
    (with how many of their messages it had ACKed SUCCESS since the lost moment)."""

    message: str
    queues: dict[str, int]


class AckJournal:
    """SUCCESS ACKs of this node per queue, per second, for the last ``SPAN`` s."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._seconds: deque[tuple[int, Counter[str]]] = deque()

    def record(self, uri: str, acked: int) -> None:
        """``acked`` PUTs to ``uri`` were just ACKed SUCCESS."""
        second = math.floor(self._clock())
        if not self._seconds or self._seconds[-1][0] != second:
            self._seconds.append((second, Counter()))
            while self._seconds[0][0] <= second - SPAN:
                self._seconds.popleft()
        self._seconds[-1][1][uri] += acked

    def since(self, moment: float) -> tuple[Counter[str], bool]:
        """ACKs per queue from ``moment`` on (the second it falls in included), and
        whether the journal reaches back that far."""
        first = math.floor(moment)
        total: Counter[str] = Counter()
        for second, counts in self._seconds:
            if second >= first:
                total.update(counts)
        covered = moment > 0 and (not self._seconds or self._seconds[0][0] <= first)
        return total, covered


def describe(where: str, why: str, acked: Counter[str], covered: bool) -> DataLoss:
    """The LOST DATA report for a loss found by the lease keeper."""
    total = sum(acked.values())
    shown = ", ".join(f"{uri} ({n})" for uri, n in acked.most_common(5))
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


__all__ = ["SPAN", "AckJournal", "DataLoss", "describe"]

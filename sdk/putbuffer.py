"""Rule 2's buffer: every posted PUT, by GUID in post order, until it is reported.

Also the PUTs the broker pushed back (``STATUS_HISTORY_FULL`` or ``QUEUE_FULL``: not
taken *yet*),
which stay buffered and are retransmitted on a back-off timer, and the age rule:
a PUT's age runs from its first post, on each hop's monotonic clock, and travels
on the wire as ``Put.age_ms`` so that no hop restarts it (``holdfast.sdk.frames``
writes it; ``SessionEngine.relay`` back-dates a relayed PUT by the age it arrived
with).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

from holdfast.sdk.types import Ack

PendingPut = tuple[
    bytes, int, bytes, dict[str, str] | None, Callable[[Ack], Any] | None, float, int
]
"""A PUT buffered until it is reported: ``(guid, queue_id, payload, properties, on_ack,
posted_at, size)``, read with the index constants below. ``posted_at`` is on the
engine's monotonic clock, back-dated by the age a relayed PUT arrived with.

A plain tuple on purpose: a producer may buffer a million PUTs, and the garbage
collector stops tracking a tuple that holds only bytes, strings, numbers, None
and str-to-str dicts, so full collections do not walk them (a class instance with
``__slots__`` is always tracked; at 100k posts/s those walks took ~15% of the CPU).
It names its queue by id for the same reason: the record holds callables.
"""

GUID: Final = 0
QUEUE_ID: Final = 1
PAYLOAD: Final = 2
PROPERTIES: Final = 3
ON_ACK: Final = 4
POSTED_AT: Final = 5
SIZE: Final = 6

PUT_OVERHEAD = 40
"""Bytes a PUT costs on the wire besides payload and properties (GUID, tags, lengths)."""

RETRY_INITIAL = 0.05
RETRY_MAXIMUM = 1.0
"""Back-off, in seconds, before a pushed-back PUT is sent again (doubling per push-back)."""


def retransmit_margin(window: float) -> float:
    """Safety margin taken off the dedup window before retransmitting a PUT.

    A retransmit still has to travel; the broker refuses (``TOO_OLD``) what arrives
    older than its window, so sending one that will surely be refused is waste.
    """
    return min(window * 0.1, 2.0)


class PutBuffer:
    """Pending PUTs in post order, their byte count, and the pushed-back ones."""

    __slots__ = (
        "_held",
        "_pending",
        "_retry_at",
        "_retry_delay",
        "busy",
        "by_guid",
        "bytes",
        "held",
    )

    def __init__(self) -> None:
        self._pending: dict[bytes, PendingPut] = {}
        self.by_guid = self._pending
        """The map itself, for the hot loops: ``Producer.buffer`` adds to it (and to
        ``bytes``) directly, the ACK loop pops from it; no method call per message."""
        self.bytes = 0
        """Wire bytes of the pending PUTs (payload, properties and overhead)."""
        self._held: dict[bytes, int] = {}
        self.held = self._held
        """Pushed-back PUTs (GUID -> queue id), waiting for their retry."""
        self.busy: set[int] = set()
        """Queues the broker pushed back on, from the push-back until a PUT of theirs gets
        an outcome (or the link drops): ``post()`` waits while its queue is here. Kept
        apart from ``held``, which empties while a retry is on the wire."""
        self._retry_at: float | None = None
        self._retry_delay = RETRY_INITIAL

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, guid: object) -> bool:
        return guid in self._pending

    def __iter__(self) -> Iterator[PendingPut]:
        """The pending PUTs in post order (a snapshot: safe to pop while iterating)."""
        return iter(list(self._pending.values()))

    def pop(self, guid: bytes) -> PendingPut | None:
        """Take a PUT out of the buffer (None if it is not pending)."""
        put = self._pending.pop(guid, None)
        if put is not None:
            self.bytes -= put[SIZE]
            self._held.pop(guid, None)
        return put

    def of_queue(self, queue_id: int) -> list[PendingPut]:
        """The pending PUTs of one queue, in post order."""
        return [put for put in self._pending.values() if put[QUEUE_ID] == queue_id]

    # ------------------------------------------------------------------ push-back

    def hold(self, guid: bytes, now: float) -> None:
        """The broker did not take this PUT yet: keep it, retry after the back-off."""
        put = self._pending.get(guid)
        if put is None:
            return
        self._held[guid] = put[QUEUE_ID]
        self.busy.add(put[QUEUE_ID])
        if self._retry_at is None:
            self._retry_at = now + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, RETRY_MAXIMUM)

    def holds_queue(self, queue_id: int) -> bool:
        """True while the broker pushes back on this queue's PUTs (``busy``)."""
        return queue_id in self.busy

    @property
    def retry_at(self) -> float | None:
        """When the held PUTs are due again (None if nothing is held)."""
        return self._retry_at

    def take_due(self, now: float) -> list[PendingPut]:
        """The held PUTs, in post order, once their retry is due (they stay pending)."""
        if self._retry_at is None or now < self._retry_at:
            return []
        held = dict(self._held)
        self._held.clear()
        self._retry_at = None
        return [put for guid, put in self._pending.items() if guid in held]

    def taken(self) -> None:
        """The broker took a PUT again: the next push-back starts the back-off afresh."""
        if not self._held:
            self._retry_delay = RETRY_INITIAL

    def release_holds(self) -> None:
        """The link dropped: held PUTs are retransmitted by the restore like any other."""
        self._held.clear()
        self.busy.clear()
        self._retry_at = None
        self._retry_delay = RETRY_INITIAL

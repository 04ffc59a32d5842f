"""Client counters: what ``Session.stats()`` returns, and where they are kept.

Each counter is bumped where its event is decided, which is the engine for all but
one: ACK outcomes (``outcomes``), reconnects and retransmits (the restore of rule
4), deliveries (the PUSH loop) and CONFIRMs/REJECTs (``confirm_wire``) are the
engine's decisions; a post that *waited* for the high watermark is the shell's
(the engine only says how long to wait, the sync and asyncio front-ends wait), so
they report it with ``SessionEngine.note_admission_wait``. Counting is plain
integer arithmetic with no I/O, so the engine stays free of it; the OpenTelemetry
export (``holdfast.sdk.tracing``) reads snapshots.
"""

from __future__ import annotations

import types
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from holdfast.sdk.types import AckStatus


@dataclass(frozen=True, slots=True)
class SessionStats:
    """A snapshot of one session's client counters (``Session.stats()``).

    ``buffered_puts`` and ``buffered_bytes`` are the state now; every other field
    counts from the session's start and only grows.
    """

    buffered_puts: int
    """PUTs posted and not yet reported (waiting for their ACK, rule 2)."""
    buffered_bytes: int
    """Wire bytes of those PUTs (payload, properties and per-PUT overhead)."""
    acks: Mapping[AckStatus, int]
    """PUT outcomes reported, by status (``UNKNOWN`` included); read-only. A status
    never reported is absent: ``stats.acks.get(AckStatus.CONFLICT, 0)``."""
    reconnects: int
    """Connections re-established after a loss (each ``Reconnected`` event)."""
    retransmitted_puts: int
    """PUTs sent again after a reconnect (rule 4; not the retries of pushed-back PUTs)."""
    high_watermark_waits: int
    """Posts that waited because the outbound buffer was over its high watermark (rule 7),
    whether they then went ahead or raised ``BandwidthLimitError``."""
    broker_busy_waits: int
    """Posts that waited because the broker pushed back on their queue (``QUEUE_FULL`` or
    ``HISTORY_FULL``), whether they then went ahead or raised ``BrokerBusyError``."""
    messages_delivered: int
    """Messages PUSHed to this session's ``on_message`` handlers or iterators."""
    messages_confirmed: int
    """CONFIRMs that left for the broker (a dropped one, ``ConfirmDroppedError``, is not
    counted)."""
    messages_rejected: int
    """REJECTs that left for the broker (``Message.reject``, and the automatic reject of a
    message whose ``on_message`` raised)."""

    @property
    def acks_total(self) -> int:
        """Every PUT outcome reported so far, whatever its status."""
        return sum(self.acks.values())


class StatsCounters:
    """The mutable counters behind ``SessionStats``; owned by one ``SessionEngine`` and
    bumped under its serialisation (the session lock, or the event loop)."""

    __slots__ = (
        "acks",
        "broker_busy_waits",
        "confirmed",
        "delivered",
        "high_watermark_waits",
        "reconnects",
        "rejected",
        "retransmitted",
    )

    def __init__(self) -> None:
        self.acks: Counter[AckStatus] = Counter()
        self.reconnects = 0
        self.retransmitted = 0
        self.high_watermark_waits = 0
        self.broker_busy_waits = 0
        self.delivered = 0
        self.confirmed = 0
        self.rejected = 0

    def snapshot(self, buffered_puts: int, buffered_bytes: int) -> SessionStats:
        """The counters now, with the buffer's state given by the engine."""
        return SessionStats(
            buffered_puts=buffered_puts,
            buffered_bytes=buffered_bytes,
            acks=types.MappingProxyType(dict(self.acks)),
            reconnects=self.reconnects,
            retransmitted_puts=self.retransmitted,
            high_watermark_waits=self.high_watermark_waits,
            broker_busy_waits=self.broker_busy_waits,
            messages_delivered=self.delivered,
            messages_confirmed=self.confirmed,
            messages_rejected=self.rejected,
        )


__all__ = ["SessionStats", "StatsCounters"]

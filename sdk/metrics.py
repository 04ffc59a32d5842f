"""``Session.stats()`` as OpenTelemetry metrics (the ``[otel]`` extra).

One set of observable instruments per process, on the global meter provider, read
at collection time: each live session (sync or asyncio, with
``SessionOptions.telemetry``) reports its ``SessionStats`` under the attribute
``holdfast.client.id`` (the session's client id, as the broker logs it). Sessions
are held weakly; a closed one stops reporting. Without OpenTelemetry, ``watch``
does nothing.

=====================================  ==============  =======  ==========================
instrument                             kind            unit     attributes
=====================================  ==============  =======  ==========================
``holdfast.client.buffered_puts``      gauge           {put}
``holdfast.client.buffered_bytes``     gauge           By
``holdfast.client.acks``               counter         {ack}    ``holdfast.ack.status``
``holdfast.client.reconnects``         counter         {reconnect}
``holdfast.client.retransmitted_puts`` counter         {put}
``holdfast.client.post_waits``         counter         {wait}   ``holdfast.wait.reason``
``holdfast.client.messages``           counter         {message} ``holdfast.message.outcome``
=====================================  ==============  =======  ==========================

``holdfast.wait.reason`` is ``high_watermark`` or ``broker_busy``;
``holdfast.message.outcome`` is ``delivered``, ``confirmed`` or ``rejected``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from holdfast.sdk import tracing
from holdfast.sdk.stats import SessionStats


class Observed(Protocol):
    """What a watched session offers: its counters and its client id."""

    @property
    def client_id(self) -> str:
        """The id the session announces in Hello."""
        ...

    def stats(self) -> SessionStats:
        """A snapshot of its counters."""
        ...


_lock = threading.Lock()
_sessions: weakref.WeakSet[Any] = weakref.WeakSet()
_instruments: list[Any] = []


def watch(session: Observed) -> None:
    """Report ``session``'s counters through OpenTelemetry metrics while it lives."""
    if not tracing.AVAILABLE:
        return
    with _lock:
        if not _instruments:
            _create_instruments()
        _sessions.add(session)


def unwatch(session: Observed) -> None:
    """Stop reporting ``session`` (it closed)."""
    with _lock:
        _sessions.discard(session)


def _snapshots() -> list[tuple[dict[str, str], SessionStats]]:
    with _lock:
        sessions = list(_sessions)
    found = []
    for session in sessions:
        try:
            found.append(({"holdfast.client.id": session.client_id}, session.stats()))
        except Exception:
            # A session closing meanwhile, or an asyncio one whose loop changed a
            # counter while this thread copied it: skipped until the next collection.
            continue
    return found


def _observer(
    values: Callable[[SessionStats], Iterable[tuple[int, dict[str, str]]]],
) -> Callable[[Any], Iterable[Any]]:
    def observe(options: Any) -> Iterable[Any]:
        observations = []
        for base, stats in _snapshots():
            for value, extra in values(stats):
                observations.append(tracing.otel_metrics.Observation(value, base | extra))
        return observations

    return observe


def _create_instruments() -> None:
    meter = tracing.otel_metrics.get_meter(tracing.SCOPE)

    def gauge(name: str, unit: str, description: str, read: Callable[[SessionStats], int]) -> None:
        _instruments.append(
            meter.create_observable_gauge(
                name,
                callbacks=[_observer(lambda s: [(read(s), {})])],
                unit=unit,
                description=description,
            )
        )

    def counter(
        name: str,
        unit: str,
        description: str,
        values: Callable[[SessionStats], Iterable[tuple[int, dict[str, str]]]],
    ) -> None:
        _instruments.append(
            meter.create_observable_counter(
                name, callbacks=[_observer(values)], unit=unit, description=description
            )
        )

    gauge(
        "holdfast.client.buffered_puts",
        "{put}",
        "PUTs posted and not yet reported",
        lambda s: s.buffered_puts,
    )
    gauge(
        "holdfast.client.buffered_bytes",
        "By",
        "Wire bytes of the PUTs posted and not yet reported",
        lambda s: s.buffered_bytes,
    )
    counter(
        "holdfast.client.acks",
        "{ack}",
        "PUT outcomes reported, by status",
        lambda s: [(n, {"holdfast.ack.status": st.value}) for st, n in s.acks.items()],
    )
    counter(
        "holdfast.client.reconnects",
        "{reconnect}",
        "Connections re-established after a loss",
        lambda s: [(s.reconnects, {})],
    )
    counter(
        "holdfast.client.retransmitted_puts",
        "{put}",
        "PUTs sent again by the restore after a reconnect",
        lambda s: [(s.retransmitted_puts, {})],
    )
    counter(
        "holdfast.client.post_waits",
        "{wait}",
        "Posts that waited: on the high watermark, or on the broker's push-back",
        lambda s: [
            (s.high_watermark_waits, {"holdfast.wait.reason": "high_watermark"}),
            (s.broker_busy_waits, {"holdfast.wait.reason": "broker_busy"}),
        ],
    )
    counter(
        "holdfast.client.messages",
        "{message}",
        "Messages delivered to the application, confirmed and rejected",
        lambda s: [
            (s.messages_delivered, {"holdfast.message.outcome": "delivered"}),
            (s.messages_confirmed, {"holdfast.message.outcome": "confirmed"}),
            (s.messages_rejected, {"holdfast.message.outcome": "rejected"}),
        ],
    )


__all__ = ["Observed", "unwatch", "watch"]

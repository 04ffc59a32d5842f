"""Prometheus metrics of the proxy (``holdfast-proxy --metrics-port PORT``).

As in the broker, the hot paths only bump plain ints on a
``holdfast.proxy.client.ProxyCounters`` shared by the client sessions;
``ProxyCollector`` turns them and the gauges it reads from the proxy into metric
families when ``/metrics`` is scraped. This module (and prometheus_client) is only
imported when ``--metrics-port`` is given.

Metrics (counters get Prometheus's ``_total`` suffix):

- ``holdfast_proxy_client_sessions``: applications connected;
- ``holdfast_proxy_upstream_connected``: 1 while the upstream session is connected;
- ``holdfast_proxy_upstream_reconnects_total``: upstream reconnections (Reconnected events);
- ``holdfast_proxy_puts_relayed_total``: client PUTs posted upstream;
- ``holdfast_proxy_acks_relayed_total{status}``: ACKs sent to clients, by status;
- ``holdfast_proxy_pending_puts``: PUTs posted upstream and not yet ACKed;
- ``holdfast_proxy_buffered_bytes``: bytes of client PUTs held until their outcomes,
  charged against ``--max-buffer-bytes`` (``holdfast_proxy_buffer_limit_bytes``);
- ``holdfast_proxy_buffered_bytes_peak``: the most ever held at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from holdfast.proto import status_name
from holdfast.proxy.budget import BufferBudget
from holdfast.proxy.routes import ProxyCounters


class ProxyCollector(Collector):
    """Reads the proxy's counters and state at scrape time."""

    def __init__(
        self,
        counters: ProxyCounters,
        sessions: Callable[[], int],
        connected: Callable[[], bool],
        pending: Callable[[], int],
        budget: BufferBudget | None = None,
    ) -> None:
        self._counters = counters
        self._sessions = sessions
        self._connected = connected
        self._pending = pending
        self._budget = budget

    def collect(self) -> Iterable[Metric]:
        counters = self._counters
        sessions = GaugeMetricFamily("holdfast_proxy_client_sessions", "applications connected")
        sessions.add_metric([], self._sessions())
        connected = GaugeMetricFamily(
            "holdfast_proxy_upstream_connected", "1 while the upstream session is connected"
        )
        connected.add_metric([], 1 if self._connected() else 0)
        reconnects = CounterMetricFamily(
            "holdfast_proxy_upstream_reconnects", "upstream reconnections"
        )
        reconnects.add_metric([], counters.reconnects)
        puts = CounterMetricFamily("holdfast_proxy_puts_relayed", "client PUTs posted upstream")
        puts.add_metric([], counters.puts_relayed)
        acks = CounterMetricFamily(
            "holdfast_proxy_acks_relayed", "ACKs sent to clients, by status", labels=["status"]
        )
        for status, count in sorted(counters.acks.copy().items()):
            acks.add_metric([status_name(status)], count)
        pending = GaugeMetricFamily(
            "holdfast_proxy_pending_puts", "PUTs posted upstream and not yet ACKed"
        )
        pending.add_metric([], self._pending())
        families: list[Metric] = [sessions, connected, reconnects, puts, acks, pending]
        budget = self._budget
        if budget is not None:
            for name, text, number in (
                ("buffered_bytes", "bytes of client PUTs held until their outcomes", budget.total),
                ("buffered_bytes_peak", "the most bytes of client PUTs held at once", budget.peak),
                ("buffer_limit_bytes", "--max-buffer-bytes", budget.max_bytes),
            ):
                gauge = GaugeMetricFamily(f"holdfast_proxy_{name}", text)
                gauge.add_metric([], number)
                families.append(gauge)
            refused = CounterMetricFamily(
                "holdfast_proxy_buffer_refused_frames",
                "client PUT frames answered LIMIT_EXCEEDED: no room within the bound's slack",
            )
            refused.add_metric([], budget.refused)
            families.append(refused)
        return families

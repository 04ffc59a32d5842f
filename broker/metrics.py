"""Prometheus metrics of the broker (``holdfast-broker --metrics-port PORT``).

The hot paths only bump plain ints kept on the objects they already touch
(``Queue.accepted``, ``Queue.pushed``, ``Queue.dedup_hits``, ``PutPipeline.acks``);
a custom collector turns them, the queue depths and the session count into metric
families when ``/metrics`` is scraped. Each broker has its own ``CollectorRegistry``,
so several brokers can run in one process (tests). The collector runs on the HTTP
server's thread and only reads: counters, ``len()`` of deques and dicts, and a copy
of the queue list, which the GIL keeps consistent enough for monitoring. This module
(and prometheus_client) is only imported when ``--metrics-port`` is given.

Metrics (counters get Prometheus's ``_total`` suffix):

- ``holdfast_broker_messages_in_total{queue}``: PUTs accepted (stored and enqueued);
- ``holdfast_broker_messages_out_total{queue}``: PUSHes (redeliveries included);
- ``holdfast_broker_acks_total{status}``: ACKs of PUTs, by status (``OK``, ...);
- ``holdfast_broker_dedup_hits_total{queue}``: replays ACKed without enqueuing;
- ``holdfast_broker_queue_depth{queue}``: ready (undelivered) messages;
- ``holdfast_broker_unconfirmed{queue}``: delivered, not yet confirmed messages;
- ``holdfast_broker_sessions``: connected sessions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from holdfast.broker.queues import Queue, QueueRegistry
from holdfast.proto import pb

log = logging.getLogger(__name__)

METRICS_HOST = "127.0.0.1"
"""The metrics endpoint only listens locally."""


def status_name(status: int) -> str:
    """``pb.STATUS_OK`` -> ``"OK"``; an unknown number as itself."""
    try:
        return pb.Status.Name(status).removeprefix("STATUS_")
    except ValueError:
        return str(status)


class BrokerCollector(Collector):
    """Reads the broker's counters and queues at scrape time."""

    def __init__(
        self,
        queues: QueueRegistry,
        acks: dict[int, int],
        sessions: Callable[[], int],
    ) -> None:
        self._queues = queues
        self._acks = acks
        self._sessions = sessions

    def collect(self) -> Iterable[Metric]:
        queues: list[Queue] = list(self._queues)
        messages_in = CounterMetricFamily(
            "holdfast_broker_messages_in", "PUTs accepted (stored and enqueued)", labels=["queue"]
        )
        messages_out = CounterMetricFamily(
            "holdfast_broker_messages_out",
            "messages PUSHed to consumers, redeliveries included",
            labels=["queue"],
        )
        dedup = CounterMetricFamily(
            "holdfast_broker_dedup_hits",
            "replayed PUTs (GUID already accepted or in flight) ACKed without enqueuing",
            labels=["queue"],
        )
        depth = GaugeMetricFamily(
            "holdfast_broker_queue_depth", "ready (undelivered) messages", labels=["queue"]
        )
        unconfirmed = GaugeMetricFamily(
            "holdfast_broker_unconfirmed",
            "messages delivered and not yet confirmed",
            labels=["queue"],
        )
        for queue in queues:
            labels = [queue.uri]
            messages_in.add_metric(labels, queue.accepted)
            messages_out.add_metric(labels, queue.pushed)
            dedup.add_metric(labels, queue.dedup_hits)
            depth.add_metric(labels, len(queue.ready))
            unconfirmed.add_metric(
                labels, sum(len(consumer.unconfirmed) for consumer in queue.consumers)
            )
        acks = CounterMetricFamily(
            "holdfast_broker_acks", "ACKs of PUTs, by status", labels=["status"]
        )
        for status, count in sorted(self._acks.copy().items()):
            acks.add_metric([status_name(status)], count)
        sessions = GaugeMetricFamily("holdfast_broker_sessions", "connected sessions")
        sessions.add_metric([], self._sessions())
        return [messages_in, messages_out, acks, dedup, depth, unconfirmed, sessions]


class MetricsServer:
    """A ``/metrics`` HTTP endpoint on its own thread, over one registry."""

    def __init__(self, collector: Collector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def start(self, port: int, host: str = METRICS_HOST) -> str:
        """Serve on ``host:port`` (0 picks a free port); the bound ``HOST:PORT``."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.address = f"{host}:{self._server.server_port}"
        return self.address

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

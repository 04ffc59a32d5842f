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

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from holdfast.broker.queues import Queue
from holdfast.broker.registry import QueueRegistry
from holdfast.proto import status_name


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

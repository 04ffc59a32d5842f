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
- ``holdfast_broker_sessions``: connected sessions;
- ``holdfast_broker_redeliveries_total{queue}``: PUSHes of messages delivered before;
- ``holdfast_broker_rejected_total{queue}``: messages consumers rejected;
- ``holdfast_broker_dead_lettered_total{queue,reason}``: messages that left for the
  dead-letter queue (or were dropped without one), by ``x-death-reason``;
- ``holdfast_broker_expired_total{queue}``: ready messages past their TTL;
- ``holdfast_broker_dead_letters_dropped_total{reason}``: dead messages dropped because
  their queue had no dead-letter queue;
- ``holdfast_broker_queue_bytes{queue}``: payload bytes of all its messages;
- ``holdfast_broker_oldest_message_age_seconds{queue}``: how long its oldest message
  has waited (0 when empty);
- ``holdfast_broker_staged_rows``: rows of transactional writes staged, not yet
  committed or discarded (``staging``);
- ``holdfast_broker_staged_rows_expired_total``: staged rows discarded at their
  deadline (each expiry is logged too);
- ``holdfast_broker_staged_rows_discarded_total``: staged rows discarded by a commit of
  another attempt or an abort.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from holdfast.broker.interfaces import MetricsQueue, MetricsQueues, StagedCounts
from holdfast.proto import status_name


def _oldest_age(queue: MetricsQueue, now: float | None) -> float:
    """Seconds the queue's oldest message has waited; 0 when empty or when the event
    loop changed the queue while this thread looked (the next scrape will see it)."""
    if now is None:
        return 0.0
    try:
        accepted_at = queue.oldest_accepted_at()
    except RuntimeError:  # a deque or dict mutated during the look
        return 0.0
    return 0.0 if accepted_at is None else max(0.0, now - accepted_at)


class BrokerCollector(Collector):
    """Reads the broker's counters and queues at scrape time."""

    def __init__(
        self,
        queues: MetricsQueues,
        acks: dict[int, int],
        sessions: Callable[[], int],
        clock: Callable[[], float] | None = None,
        staging: StagedCounts | None = None,
    ) -> None:
        self._queues = queues
        self._clock = clock
        self._staging = staging
        self._acks = acks
        self._sessions = sessions

    def collect(self) -> Iterable[Metric]:
        queues: list[MetricsQueue] = list(self._queues)
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
        return [
            messages_in,
            messages_out,
            acks,
            dedup,
            depth,
            unconfirmed,
            sessions,
            *self._policy_metrics(queues),
            *self._staging_metrics(),
        ]

    def _staging_metrics(self) -> list[Metric]:
        """Staged rows of transactional writes, and what became of them."""
        book = self._staging
        if book is None:
            return []
        staged = GaugeMetricFamily(
            "holdfast_broker_staged_rows", "rows staged, not yet committed or discarded"
        )
        staged.add_metric([], book.staged_total)
        expired = CounterMetricFamily(
            "holdfast_broker_staged_rows_expired", "staged rows discarded at their deadline"
        )
        expired.add_metric([], book.expired_rows)
        discarded = CounterMetricFamily(
            "holdfast_broker_staged_rows_discarded",
            "staged rows discarded by a commit of another attempt or an abort",
        )
        discarded.add_metric([], book.discarded_rows)
        return [staged, expired, discarded]

    def _policy_metrics(self, queues: list[MetricsQueue]) -> list[Metric]:
        """What consumers' failures and queue policies did (issue #14's metrics)."""
        redeliveries = CounterMetricFamily(
            "holdfast_broker_redeliveries", "PUSHes of messages delivered before", labels=["queue"]
        )
        rejected = CounterMetricFamily(
            "holdfast_broker_rejected", "messages consumers rejected", labels=["queue"]
        )
        dead = CounterMetricFamily(
            "holdfast_broker_dead_lettered",
            "messages dead-lettered (or dropped without a dead-letter queue), by reason",
            labels=["queue", "reason"],
        )
        expired = CounterMetricFamily(
            "holdfast_broker_expired", "ready messages past their TTL", labels=["queue"]
        )
        size = GaugeMetricFamily(
            "holdfast_broker_queue_bytes", "payload bytes of all messages", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "holdfast_broker_oldest_message_age_seconds",
            "how long the oldest message has waited",
            labels=["queue"],
        )
        now = self._clock() if self._clock is not None else None
        for queue in queues:
            labels = [queue.uri]
            redeliveries.add_metric(labels, queue.redelivered)
            rejected.add_metric(labels, queue.rejected)
            for reason, count in sorted(queue.dead.copy().items()):
                dead.add_metric([queue.uri, reason], count)
            expired.add_metric(labels, queue.dead["expired"])
            size.add_metric(labels, queue.live_bytes)
            oldest.add_metric(labels, _oldest_age(queue, now))
        dropped = CounterMetricFamily(
            "holdfast_broker_dead_letters_dropped",
            "dead messages dropped: their queue had no dead-letter queue",
            labels=["reason"],
        )
        for reason, count in sorted(self._queues.graveyard.dropped.copy().items()):
            dropped.add_metric([reason], count)
        return [redeliveries, rejected, dead, expired, size, oldest, dropped]

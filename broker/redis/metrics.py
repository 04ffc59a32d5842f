"""Prometheus metrics of a broker node on Redis: its lease, what it reclaimed and
revoked, and the losses it found (registered beside the broker's own collector when
``--metrics-port`` is given; imported only then).

- ``holdfast_broker_redis_lease_lapses_total``: times this node's lease lapsed (it
  revoked its deliveries and rejoined under a new fencing token);
- ``holdfast_broker_redis_lease_renewal_seconds``: how long the last renewal took;
- ``holdfast_broker_redis_revoked_total``: deliveries voided by those lapses;
- ``holdfast_broker_redis_reclaimed_total``: deliveries of dead incarnations this node
  put back;
- ``holdfast_broker_redis_data_losses_total``: losses of acknowledged data found
  (each logged as LOST DATA);
- ``holdfast_broker_redis_owed_messages``: messages of give-backs and confirms Redis
  did not take, waiting for the sweep to write them (``owed``); above 0 for long, the
  node's pool cannot write to Redis while its lease still can.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from holdfast.broker.redis.nodes import NodeLife


class RedisNodeCollector(Collector):
    """Reads a node's lease and loss counters at scrape time."""

    def __init__(self, life: NodeLife) -> None:
        self._life = life

    def collect(self) -> Iterable[Metric]:
        life = self._life
        counters = (
            ("lease_lapses", "times this node's lease lapsed", life.keeper.lapses),
            ("revoked", "deliveries voided because the lease lapsed", life.revoked),
            ("reclaimed", "deliveries of dead incarnations put back", life.reclaimed),
            ("data_losses", "losses of acknowledged data found", life.data_losses),
        )
        metrics: list[Metric] = []
        for name, text, value in counters:
            family = CounterMetricFamily(f"holdfast_broker_redis_{name}", text)
            family.add_metric([], value)
            metrics.append(family)
        renewal = GaugeMetricFamily(
            "holdfast_broker_redis_lease_renewal_seconds", "how long the last renewal took"
        )
        renewal.add_metric([], life.keeper.last_renewal_seconds)
        metrics.append(renewal)
        owed = GaugeMetricFamily(
            "holdfast_broker_redis_owed_messages",
            "messages of give-backs and confirms Redis did not take yet",
        )
        owed.add_metric([], len(life.registry.owed))
        metrics.append(owed)
        return metrics


__all__ = ["RedisNodeCollector"]

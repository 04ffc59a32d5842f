"""``holdfast-proxy --metrics-port 0``: the Prometheus endpoint counts what it relayed."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
from holdfast.sdk import Session
from tests.support.metrics import Samples, metrics_address, scrape, value
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until
from tests.support.wire_client import WireClient

FAST_UPSTREAM = ["--keepalive", "0.5", "--keepalive-timeout", "1", "--reconnect-max", "0.2"]


@pytest.mark.timeout(60)
def test_metrics_count_relayed_puts_acks_sessions_and_reconnects() -> None:
    uri = unique_uri("proxy-metrics")
    with (
        BrokerProcess(["--metrics-port", "0"]) as broker,
        ProxyProcess(
            ["--upstream", broker.address, "--metrics-port", "0", *FAST_UPSTREAM]
        ) as proxy,
    ):
        metrics = metrics_address(proxy)
        broker_metrics = metrics_address(broker)
        wait_until(
            lambda: value(scrape(metrics), "holdfast_proxy_upstream_connected") == 1,
            10,
            "the proxy's upstream to connect",
        )
        assert value(scrape(metrics), "holdfast_proxy_client_sessions") == 0

        with Session(proxy.address, options=FAST) as session:
            queue = session.open_queue(uri, write=True)
            for i in range(5):
                queue.post(b"m%d" % i)
            assert session.flush(timeout=30)

        guid = uuid.uuid4().bytes
        with WireClient(proxy.address) as wire:
            wire.hello()
            assert wire.open(1, uri, write=True).status == pb.STATUS_OK
            wire.put(1, [(guid, b"once", {})])
            assert [ack.status for ack in wire.acks(1)] == [pb.STATUS_OK]
            # A replay, and a PUT on a handle that is not open (judged by the proxy).
            wire.put(1, [(guid, b"once", {})])
            wire.put(2, [(uuid.uuid4().bytes, b"x", {})])
            # The proxy answers the unknown handle itself, so that ACK may come first.
            statuses = sorted(ack.status for ack in wire.acks(2))
            assert statuses == sorted([pb.STATUS_OK, pb.STATUS_UNKNOWN_QUEUE])

            def one_client(samples: Samples) -> bool:
                return value(samples, "holdfast_proxy_client_sessions") == 1

            wait_until(lambda: one_client(scrape(metrics)), 10, "1 client session")
            samples = scrape(metrics)
            assert value(samples, "holdfast_proxy_puts_relayed_total") == 7
            assert value(samples, "holdfast_proxy_acks_relayed_total", status="OK") == 7
            assert value(samples, "holdfast_proxy_acks_relayed_total", status="UNKNOWN_QUEUE") == 1
            assert value(samples, "holdfast_proxy_pending_puts") == 0
            assert value(samples, "holdfast_proxy_upstream_reconnects_total") == 0

            # The replay went upstream and the broker's dedup absorbed it.
            upstream = scrape(broker_metrics)
            assert value(upstream, "holdfast_broker_messages_in_total", queue=uri) == 6
            assert value(upstream, "holdfast_broker_dedup_hits_total", queue=uri) == 1
            assert value(upstream, "holdfast_broker_queue_depth", queue=uri) == 6
            assert value(upstream, "holdfast_broker_sessions") == 1  # the proxy's upstream

            broker.restart()

            def reconnected() -> bool:
                samples = scrape(metrics)
                return (
                    value(samples, "holdfast_proxy_upstream_reconnects_total") == 1
                    and value(samples, "holdfast_proxy_upstream_connected") == 1
                )

            wait_until(reconnected, 20, "the proxy's upstream to reconnect")

        wait_until(
            lambda: value(scrape(metrics), "holdfast_proxy_client_sessions") == 0,
            10,
            "no client sessions",
        )


def test_no_metrics_endpoint_by_default() -> None:
    with BrokerProcess() as broker, ProxyProcess(["--upstream", broker.address]) as proxy:
        assert "metrics on" not in proxy.output

"""``holdfast-broker --metrics-port 0``: the Prometheus endpoint counts what happened."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
from holdfast.sdk import Message, QueueOptions, Session
from holdfast.sdk.staging import Version, commit, stage
from tests.support.metrics import metrics_address, scrape, value
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until
from tests.support.wire_client import WireClient


@pytest.mark.timeout(60)
def test_metrics_count_puts_dedup_hits_acks_depth_and_sessions() -> None:
    uri = unique_uri("metrics")
    with BrokerProcess(["--metrics-port", "0"]) as broker:
        metrics = metrics_address(broker)
        assert metrics.startswith("127.0.0.1:")
        assert value(scrape(metrics), "holdfast_broker_sessions") == 0

        with Session(broker.address, options=FAST) as session:
            queue = session.open_queue(uri, write=True)
            for i in range(5):
                queue.post(b"m%d" % i)
            assert session.flush(timeout=30)

        guid = uuid.uuid4().bytes
        with WireClient(broker.address) as wire:
            wire.hello()
            assert wire.open(1, uri, write=True).status == pb.STATUS_OK
            wire.put(1, [(guid, b"once", {})])
            assert [ack.status for ack in wire.acks(1)] == [pb.STATUS_OK]
            # A replay, and a PUT with an invalid pickup TTL.
            wire.put(1, [(guid, b"once", {}), (uuid.uuid4().bytes, b"x", {"x-ttl-ms": "soon"})])
            statuses = [ack.status for ack in wire.acks(2)]
            assert statuses == [pb.STATUS_OK, pb.STATUS_INVALID_PROPERTIES]

            received: list[Message] = []  # not confirmed: they stay unconfirmed
            with Session(broker.address, options=FAST) as consumer:
                consumer.open_queue(
                    uri,
                    read=True,
                    on_message=received.append,
                    options=QueueOptions(max_unconfirmed_messages=2),
                )
                wait_until(lambda: len(received) == 2, 10, "2 deliveries")

                def settled() -> bool:
                    samples = scrape(metrics)
                    return value(samples, "holdfast_broker_sessions") == 2 and (
                        value(samples, "holdfast_broker_messages_out_total", queue=uri) == 2
                    )

                wait_until(settled, 10, "2 sessions and 2 PUSHes in the metrics")
                samples = scrape(metrics)
                assert value(samples, "holdfast_broker_messages_in_total", queue=uri) == 6
                assert value(samples, "holdfast_broker_dedup_hits_total", queue=uri) == 1
                assert value(samples, "holdfast_broker_acks_total", status="OK") == 7
                assert (
                    value(samples, "holdfast_broker_acks_total", status="INVALID_PROPERTIES") == 1
                )
                assert value(samples, "holdfast_broker_queue_depth", queue=uri) == 4
                assert value(samples, "holdfast_broker_unconfirmed", queue=uri) == 2

        # Both sessions gone: their unconfirmed messages went back to the queue.
        def drained() -> bool:
            samples = scrape(metrics)
            return (
                value(samples, "holdfast_broker_sessions") == 0
                and value(samples, "holdfast_broker_queue_depth", queue=uri) == 6
                and value(samples, "holdfast_broker_unconfirmed", queue=uri) == 0
            )

        wait_until(drained, 10, "no sessions and 6 ready messages in the metrics")


def test_no_metrics_endpoint_by_default() -> None:
    with BrokerProcess() as broker:
        assert "metrics on" not in broker.output


@pytest.mark.timeout(60)
def test_metrics_count_staged_and_discarded_rows() -> None:
    uri = unique_uri("staged-metrics")
    with BrokerProcess(["--metrics-port", "0"]) as broker:
        metrics = metrics_address(broker)
        version = Version([broker.address], uri, "app", 0, 15.0)
        rows = [(uuid.uuid4().bytes, b"r", None) for _ in range(6)]
        stage(version, 0, 0, rows)
        stage(version, 0, 1, rows)
        samples = scrape(metrics)
        assert value(samples, "holdfast_broker_staged_rows") == 12
        commit(version, {(0, 1): 6}, b"d", 6)
        samples = scrape(metrics)
        assert value(samples, "holdfast_broker_staged_rows") == 0
        assert value(samples, "holdfast_broker_staged_rows_discarded_total") == 6
        assert value(samples, "holdfast_broker_staged_rows_expired_total") == 0
        assert value(samples, "holdfast_broker_messages_in_total", queue=uri) == 6

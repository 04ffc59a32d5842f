"""``spark.read`` / ``spark.readStream`` ``.format("holdfast")`` on Spark local mode:
the Kafka-like columns, a batch peek and a batch consume, the ``availableNow`` and
``once`` triggers, and a bad option failing with its own error."""

from __future__ import annotations

import datetime
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from holdfast.sdk import Session
from holdfast.sdk.spark import register
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, drain_messages, unique_uri


@pytest.fixture(scope="module")
def hf(spark: Any) -> Any:
    """The module's SparkSession with ``format("holdfast")`` registered."""
    register(spark)
    return spark


def post(address: str, uri: str, count: int, start: int = 0) -> list[uuid.UUID]:
    """``count`` messages ``m<i>``, the even ones with an ``x-key`` and a property."""
    with Session(address, options=FAST) as session:
        queue = session.open_queue(uri, write=True)
        guids = []
        for i in range(start, start + count):
            properties = {"x-key": f"k{i}", "n": str(i)} if i % 2 == 0 else None
            guids.append(queue.post(f"m{i}".encode(), properties))
        assert session.flush(30)
    return guids


@pytest.mark.timeout(120)
def test_a_batch_read_peeks_with_the_kafka_like_columns(hf: Any, broker: BrokerProcess) -> None:
    uri = unique_uri("peek")
    before = datetime.datetime.now(datetime.UTC)
    guids = post(broker.address, uri, 2_500)
    after = datetime.datetime.now(datetime.UTC)
    df = hf.read.format("holdfast").option("uri", uri).option("address", broker.address).load()
    assert df.columns == [
        "key",
        "value",
        "properties",
        "queue",
        "guid",
        "timestamp",
        "deliveryCount",
    ]
    rows = df.collect()
    assert len(rows) == 2_500
    assert [uuid.UUID(r.guid) for r in rows] == guids  # the queue's order
    first, second = rows[0], rows[1]
    assert (first.key, bytes(first.value), first.properties["n"]) == ("k0", b"m0", "0")
    assert (second.key, second.properties, first.queue) == (None, {}, uri)
    assert {r.deliveryCount for r in rows} == {0}  # peeked: never delivered
    slack = datetime.timedelta(seconds=2)
    stamps = [r.timestamp.astimezone(datetime.UTC) for r in rows]
    assert all(before - slack <= t <= after + slack for t in stamps)
    assert len(drain_messages(broker.address, uri, 2_500)) == 2_500  # all still there


@pytest.mark.timeout(120)
def test_a_batch_read_with_consume_takes_the_messages_through_a_proxy(
    hf: Any, broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    uri = unique_uri("consume")
    guids = post(broker.address, uri, 1_200)
    df = (
        hf.read.format("holdfast")
        .option("uri", uri)
        .option("address", proxy.address)
        .option("consume", "true")
        .option("maxRowsPerBatch", "500")
        .load()
    )
    rows = df.collect()
    assert sorted(uuid.UUID(r.guid) for r in rows) == sorted(guids)
    assert {r.deliveryCount for r in rows} == {1}
    assert drain_messages(broker.address, uri, 0) == []  # consumed


def stream_to_memory(hf: Any, uri: str, address: str, name: str, tmp: Path, **trigger: Any) -> Any:
    query = (
        hf.readStream.format("holdfast")
        .option("uri", uri)
        .option("address", address)
        .option("maxRowsPerBatch", "500")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp / name))
        .trigger(**trigger)
        .start()
    )
    assert query.awaitTermination(90), "the query did not stop by itself"
    assert query.exception() is None
    return query


@pytest.mark.timeout(180)
def test_available_now_reads_what_is_there_in_batches_and_stops(
    hf: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    uri = unique_uri("available-now")
    guids = post(broker.address, uri, 1_200)
    query = stream_to_memory(hf, uri, broker.address, "avail", tmp_path, availableNow=True)
    rows = hf.sql("SELECT guid, key, deliveryCount FROM avail").collect()
    assert sorted(uuid.UUID(r.guid) for r in rows) == sorted(guids)
    assert sum(1 for r in rows if r.key is not None) == 600
    assert len([p for p in query.recentProgress if p["numInputRows"] > 0]) == 3  # 500s
    # The last batch's CONFIRMs go when Spark commits it; nothing is left in the queue.
    time.sleep(0.5)
    assert drain_messages(broker.address, uri, 0) == []


@pytest.mark.timeout(180)
def test_trigger_once_reads_the_backlog(hf: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    uri = unique_uri("once")
    guids = post(broker.address, uri, 300)
    stream_to_memory(hf, uri, broker.address, "once", tmp_path, once=True)
    rows = hf.sql("SELECT guid FROM once").collect()
    assert sorted(uuid.UUID(r.guid) for r in rows) == sorted(guids)


@pytest.mark.timeout(120)
def test_a_stream_read_with_a_bad_option_fails_with_that_error_only(
    hf: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    for option, value, expected in [
        ("maxRowsPerBatch", "0", "maxRowsPerBatch must be > 0"),
        ("nope", "1", "has no option 'nope'"),
        ("consume", "true", "option consume applies only to batch reads"),
    ]:
        stream = (
            hf.readStream.format("holdfast")
            .option("uri", unique_uri("bad"))
            .option("address", broker.address)
            .option(option, value)
            .load()
        )
        with pytest.raises(Exception) as caught:
            query = stream.writeStream.format("memory").queryName(f"bad_{option}").start()
            query.awaitTermination(60)
            raise AssertionError("the query ran with a bad option")
        text = str(caught.value)
        assert expected in text
        assert "InvalidArgumentError" in text
        assert "UnboundLocalError" not in text


@pytest.mark.timeout(60)
def test_a_batch_read_with_a_streaming_only_option_fails_on_the_driver(
    hf: Any, tmp_path: Path
) -> None:
    # No broker: the option is refused before any task would connect.
    with pytest.raises(Exception) as caught:
        hf.read.format("holdfast").option("uri", unique_uri("bad")).option(
            "walPath", str(tmp_path)
        ).load().collect()
    text = str(caught.value)
    assert "option walPath applies only to streaming reads" in text
    assert "InvalidArgumentError" in text

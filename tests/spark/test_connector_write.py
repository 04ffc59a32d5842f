"""``df.write.format("holdfast")`` on Spark local mode (``local[2,4]``), through a real
proxy and broker: a killed task, identical rows across partitions, keys repeated across
partitions, a changed replay, options checked on the driver."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

from holdfast.sdk import Session
from holdfast.sdk.spark import register
from holdfast.sdk.spark.arrow import arrow_ready
from tests.spark import faults
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, drain_messages, unique_uri

cloudpickle.register_pickle_by_value(faults)  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def hf(spark: Any) -> Any:
    """The module's SparkSession with ``format("holdfast")`` registered."""
    register(spark)
    return spark


def clickstream(spark: Any, total: int, distinct: int, partitions: int) -> Any:
    """``total`` rows with only ``distinct`` different contents, spread round-robin over
    ``partitions`` partitions, so every content appears in every partition."""
    ids = spark.range(0, total, numPartitions=partitions)
    return ids.select(
        (F.col("id") % distinct).alias("page"),
        F.concat(F.lit("user-"), (F.col("id") % distinct % 7).cast("string")).alias("user"),
    )


def write(df: Any, uri: str, address: str, **options: str) -> None:
    writer = df.write.format("holdfast").option("uri", uri).option("address", address)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.mode("append").save()


@pytest.mark.timeout(180)
def test_identical_rows_across_partitions_all_arrive_and_a_killed_task_adds_nothing(
    hf: Any, broker: BrokerProcess, proxy: ProxyProcess, tmp_path: Path
) -> None:
    """20k clickstream rows with 150 distinct contents over 4 partitions: every row is
    a message (content keys do not merge identical rows), though partition 1's first
    attempt dies after 2,000 rows and Spark retries it."""
    total, uri = 20_000, unique_uri("clicks")
    killer = faults.FailingRows(str(tmp_path), partition=1, after=2_000)
    df = clickstream(hf, total, 150, 4)
    df = hf.createDataFrame(df.rdd.mapPartitions(killer), df.schema)
    write(df, uri, proxy.address)
    assert (tmp_path / "failed-p1-a0").read_text() == "2000"
    messages = drain_messages(broker.address, uri, total)
    assert len(messages) == total
    assert len({m.guid for m in messages}) == total
    assert len({m.payload for m in messages}) == 150
    assert Counter(json.loads(m.payload)["page"] for m in messages) == Counter(
        i % 150 for i in range(total)
    )


@pytest.mark.timeout(120)
def test_a_key_repeated_across_partitions_fails_the_write_loudly(
    hf: Any, proxy: ProxyProcess
) -> None:
    df = hf.range(0, 1_000, numPartitions=2).select((F.col("id") % 500).alias("order_id"))
    with pytest.raises(Exception, match="500 values of key column 'order_id' appear in more"):
        write(df, unique_uri("dupkeys"), proxy.address, keyColumn="order_id")


@pytest.mark.timeout(120)
def test_a_committed_run_replayed_adds_nothing_and_a_changed_replay_fails(
    hf: Any, broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """A job re-run under the same runId after the broker's 1 s dedup window: the
    commit mark makes it add nothing; the same runId with changed rows fails loudly."""
    broker: BrokerProcess = broker_factory("--dedup-window", "1")
    uri = unique_uri("replay")
    df = hf.range(0, 3_000, numPartitions=3).select(
        F.col("id").alias("order_id"), (F.col("id") * 2).alias("amount")
    )
    write(df, uri, broker.address, keyColumn="order_id", runId="nightly-2026-11-22")
    assert len(drain_messages(broker.address, uri, 3_000)) == 3_000
    with Session(broker.address, options=FAST) as session:
        mark = session.commit_mark(uri, "nightly-2026-11-22")
    assert mark is not None and mark.rows == 3_000
    time.sleep(1.5)  # past the dedup window: only the commit mark can recognise the replay
    write(df, uri, broker.address, keyColumn="order_id", runId="nightly-2026-11-22")
    assert drain_messages(broker.address, uri, 0) == []
    changed = df.withColumn("amount", F.col("amount") + 1)
    with pytest.raises(Exception, match=r"committed before .* with other content"):
        write(changed, uri, broker.address, keyColumn="order_id", runId="nightly-2026-11-22")
    assert drain_messages(broker.address, uri, 0) == []


@pytest.mark.timeout(60)
def test_bad_options_fail_on_the_driver_before_any_task(hf: Any, proxy: ProxyProcess) -> None:
    df = hf.range(0, 10)
    with pytest.raises(Exception, match=r"needs .option\(.uri."):
        df.write.format("holdfast").mode("append").save()
    with pytest.raises(Exception, match="expected hf://"):
        write(df, "kafka://x", proxy.address)
    with pytest.raises(Exception, match="no column 'nope'"):
        write(df, unique_uri("opts"), proxy.address, keyColumn="nope")
    with pytest.raises(Exception, match="no option 'uril'"):
        df.write.format("holdfast").option("uril", "hf://a/b").mode("append").save()


@pytest.mark.timeout(60)
def test_save_modes_other_than_append_are_refused(hf: Any, broker: BrokerProcess) -> None:
    uri = unique_uri("modes")
    df = hf.range(0, 10)
    writer = df.write.format("holdfast").option("uri", uri).option("address", broker.address)
    with pytest.raises(Exception, match="appends to a queue: save mode 'overwrite'"):
        writer.mode("overwrite").save()
    for mode in ("error", "ignore"):
        with pytest.raises(Exception, match=r"(?i)mode|not supported"):
            writer.mode(mode).save()
    assert drain_messages(broker.address, uri, 0) == []


def write_stream(hf: Any, source: Path, uri: str, address: str, checkpoint: Path) -> Any:
    stream = hf.readStream.schema("order_id LONG").option("maxFilesPerTrigger", 1).json(str(source))
    return (
        stream.writeStream.format("holdfast")
        .option("uri", uri)
        .option("address", address)
        .option("keyColumn", "order_id")
        .option("runId", "orders-stream")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


@pytest.mark.timeout(180)
def test_a_run_id_reused_with_a_new_checkpoint_fails_loudly_and_writes_nothing(
    hf: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    """Three batches are committed under runId ``orders-stream``; a query with a fresh
    checkpoint and the same runId starts at batch 0: it fails, saying what to do, and
    the queue has the first query's 300 rows only."""
    uri, source = unique_uri("reset"), tmp_path / "in"
    source.mkdir()
    for batch in range(3):
        lines = "".join(f'{{"order_id": {batch * 100 + i}}}\n' for i in range(100))
        (source / f"part-{batch}.json").write_text(lines)
    first = write_stream(hf, source, uri, broker.address, tmp_path / "checkpoint-1")
    assert first.awaitTermination(90) and first.exception() is None
    (source / "part-3.json").write_text('{"order_id": 300}\n')
    second = write_stream(hf, source, uri, broker.address, tmp_path / "checkpoint-2")
    with pytest.raises(Exception, match=r"committed up to version 2 .* writing version 0"):
        second.awaitTermination(90)
    assert "restore the checkpoint" in str(second.exception())
    messages = drain_messages(broker.address, uri, 300)
    assert sorted(json.loads(m.payload)["order_id"] for m in messages) == list(range(300))
    assert {m.properties["x-key"] for m in messages} == {str(i) for i in range(300)}


@pytest.mark.timeout(180)
def test_columns_arrow_does_not_carry_as_is_are_written_from_rows_once(
    hf: Any, broker: BrokerProcess
) -> None:
    """A timestamp, a binary and an array column: the writer reads ``Row``\\s, not
    Arrow batches (``arrow.arrow_ready``), and every row arrives once, encoded by
    ``json_default``; the same run again adds nothing."""
    total, uri = 2_000, unique_uri("row-path")
    df = hf.range(0, total, numPartitions=3).select(
        F.col("id").alias("order_id"),
        F.timestamp_seconds(F.col("id")).alias("at"),
        F.col("id").cast("string").cast("binary").alias("raw"),
        F.array(F.col("id"), F.col("id") + 1).alias("pair"),
    )
    assert not arrow_ready(df.schema)
    for _ in range(2):
        write(df, uri, broker.address, keyColumn="order_id", runId="row-path-run")
    rows = [json.loads(m.payload) for m in drain_messages(broker.address, uri, total)]
    assert Counter(row["order_id"] for row in rows) == Counter(range(total))
    seven = next(row for row in rows if row["order_id"] == 7)
    assert seven["pair"] == [7, 8] and seven["raw"] == "Nw=="  # base64 of b"7"
    assert seven["at"].startswith("19")  # ISO 8601, in the session's time zone


@pytest.mark.timeout(60)
def test_key_column_named_in_another_case_keys_the_rows_by_that_column(
    hf: Any, broker: BrokerProcess
) -> None:
    # Spark matches column names ignoring case; keyColumn "ID" was "no column 'ID'".
    uri = unique_uri("key-case")
    write(hf.range(0, 20, numPartitions=2), uri, broker.address, keyColumn="ID")
    keys = sorted(int(m.properties["x-key"]) for m in drain_messages(broker.address, uri, 20))
    assert keys == list(range(20))

"""The Spark sink on Spark local mode (``local[2,4]``), through a real proxy and broker.

The acceptance test of issue #7: 100k rows written with ``foreachPartition`` while
one task fails part-way through its partition (Spark retries it) and the proxy's
link to the broker is cut and restored; the queue then holds every row exactly
once. And ``foreachBatch``: the same batch written twice adds nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

from holdfast.sdk.spark import QueueSink
from tests.spark import faults
from tests.spark.faults import ScriptedSerializer
from tests.spark.helpers import JVM_OPTIONS
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import drain_messages, unique_uri
from tests.support.waiting import wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# The workers unpickle the scripted serializers without importing the tests package.
cloudpickle.register_pickle_by_value(faults)  # type: ignore[no-untyped-call]


def proxy_saw(proxy: ProxyProcess, text: str) -> bool:
    """Whether the proxy logged ``text`` (it logs its upstream session's events)."""
    return text in proxy.output


def orders(spark: Any, total: int, partitions: int) -> Any:
    """``total`` rows ``(n, text, amount, day)``, hash-partitioned on ``n`` after a shuffle.

    Rows with an id below half of ``total`` come in identical pairs (``n`` is the id
    rounded down to even), so content keys must number identical rows #0 and #1;
    identical rows share ``n`` and so a partition.
    """
    ids = spark.range(0, total, numPartitions=partitions)
    n = F.when(F.col("id") < total // 2, F.col("id") - F.col("id") % 2).otherwise(F.col("id"))
    return (
        ids.select(n.alias("n"))
        .repartition(partitions, "n")
        .select(
            "n",
            F.concat(F.lit("row-"), F.col("n").cast("string")).alias("text"),
            (F.col("n").cast("decimal(12,0)") / 100).cast("decimal(12,2)").alias("amount"),
            F.date_add(F.lit("2024-01-01").cast("date"), (F.col("n") % 365).cast("int")).alias(
                "day"
            ),
        )
    )


def expected_payload(n: int) -> bytes:
    """The default serializer's JSON for the row ``orders`` makes from ``n``."""
    day = datetime.date(2024, 1, 1) + datetime.timedelta(days=n % 365)
    row = {"n": n, "text": f"row-{n}", "amount": f"{n // 100}.{n % 100:02d}", "day": str(day)}
    return json.dumps(row, separators=(",", ":")).encode()


def expected_orders(total: int) -> Counter[bytes]:
    """Each payload ``orders(total)`` produces, with how many rows carry it."""
    half = total // 2
    return Counter(expected_payload(i - i % 2 if i < half else i) for i in range(total))


class JobThread(threading.Thread):
    """Runs a Spark action off the main thread, keeping its exception."""

    def __init__(self, action: Any) -> None:
        super().__init__(name="spark-job", daemon=True)
        self._action = action
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._action()
        except BaseException as error:
            self.error = error


@pytest.mark.timeout(300)
def test_100k_rows_exactly_once_through_a_task_retry_and_an_upstream_outage(
    spark: Any, broker: BrokerProcess, proxy: ProxyProcess, tmp_path: Path
) -> None:
    """(a) partition 1's first attempt dies after posting 10k rows and Spark retries it;
    (b) while partition 0 is being written, the broker is frozen (SIGSTOP) until the
    proxy's keepalive declares its upstream lost, then thawed. Draining the queue gives
    every row exactly once: no GUID twice, and the payloads are the rows."""
    total = 100_000
    uri = unique_uri("spark-100k")
    serializer = ScriptedSerializer(
        str(tmp_path), fail_partition=1, fail_after=10_000, signal_partition=0, signal_after=5_000
    )
    sink = QueueSink(
        uri,
        run_id="acceptance",
        address=proxy.address,
        serializer=serializer,
        properties_from=("n",),
    )
    df = orders(spark, total, partitions=4)
    job = JobThread(lambda: df.foreachPartition(sink))
    started = time.monotonic()
    job.start()

    wait_until((tmp_path / "progress").exists, 120, "partition 0 to post 5000 rows")
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: proxy_saw(proxy, "ConnectionLost"), 15, "the proxy to lose upstream")
        assert job.is_alive(), "the outage must fall inside the job"
        time.sleep(1.0)
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    job.join(240)
    assert not job.is_alive(), "the Spark job did not finish within 240 s"
    assert job.error is None, f"the Spark job failed: {job.error!r}"
    elapsed = time.monotonic() - started

    # (a) happened: attempt 0 of partition 1 died after 10k rows, and a retry succeeded.
    assert (tmp_path / "failed-p1-a0").read_text() == "10000"
    assert (tmp_path / "attempt-p1-a1").exists()
    # (b) happened: the proxy lost its upstream and restored it.
    wait_until(lambda: proxy_saw(proxy, "StateRestored"), 15, "the proxy to restore upstream")

    messages = drain_messages(broker.address, uri, total)
    attempts = sorted(path.name for path in tmp_path.glob("attempt-*"))
    print(f"\n100k rows via Spark in {elapsed:.1f} s (retry + outage included); {attempts}")
    guids = Counter(m.guid for m in messages)
    assert len(messages) == total
    assert [g for g, k in guids.items() if k > 1] == []
    assert all(guid.version == 8 for guid in guids)
    assert Counter(m.payload for m in messages) == expected_orders(total)
    assert all(json.loads(m.payload)["n"] == int(m.properties["n"]) for m in messages)


@pytest.mark.timeout(120)
def test_the_same_foreach_batch_batch_twice_adds_nothing_the_second_time(
    spark: Any, broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    """``write_batch(df, 7)`` twice leaves each row once; batch 8 is another run, so the
    same rows are new messages there."""
    uri = unique_uri("spark-batch")
    df = orders(spark, 2_000, partitions=2).withColumnRenamed("n", "order_id")
    df = df.dropDuplicates(["order_id"])  # a key column must be unique
    sink = QueueSink(uri, run_id="orders-stream", address=proxy.address, key_column="order_id")
    sink.write_batch(df, 7)
    sink.write_batch(df, 7)
    first = drain_messages(broker.address, uri, 1_500)
    assert len(first) == 1_500
    assert len({m.guid for m in first}) == 1_500
    sink.write_batch(df, 8)
    again = drain_messages(broker.address, uri, 1_500)
    assert len(again) == 1_500
    assert {m.guid for m in again}.isdisjoint(m.guid for m in first)
    assert Counter(m.payload for m in again) == Counter(m.payload for m in first)


@pytest.mark.timeout(180)
def test_a_streaming_batch_rerun_after_a_restart_adds_nothing(
    spark: Any, broker: BrokerProcess, proxy: ProxyProcess, tmp_path: Path
) -> None:
    """A real Structured Streaming query: its last batch's commit is lost (as when the
    driver dies between writing and committing), so on restart Spark runs that batch
    again under the same batch id. The queue holds each row once."""
    uri = unique_uri("spark-stream")
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    for batch in range(3):
        lines = (json.dumps({"order_id": batch * 100 + i, "item": f"i{i}"}) for i in range(100))
        (source / f"part-{batch}.json").write_text("\n".join(lines) + "\n")
    sink = QueueSink(uri, run_id=str(checkpoint), address=proxy.address, key_column="order_id")
    batches: list[int] = []

    def write(df: Any, batch_id: int) -> None:
        batches.append(batch_id)
        sink.write_batch(df, batch_id)

    def run_query() -> None:
        stream = (
            spark.readStream.schema("order_id LONG, item STRING")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        query = (
            stream.writeStream.foreachBatch(write)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    run_query()
    assert batches == [0, 1, 2]
    assert len(drain_messages(broker.address, uri, 300)) == 300

    # Batch 2 ran but its commit was lost (with the checksum file Hadoop keeps beside it).
    for name in ("2", ".2.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    run_query()
    assert batches == [0, 1, 2, 2]
    assert drain_messages(broker.address, uri, 0) == []


@pytest.mark.timeout(120)
def test_a_duplicate_key_in_a_partition_fails_the_job_with_a_clear_error(
    spark: Any, proxy: ProxyProcess
) -> None:
    df = spark.createDataFrame([(1, "a"), (2, "b"), (1, "c")], "id LONG, v STRING").coalesce(1)
    sink = QueueSink(unique_uri("spark-dup"), run_id="r", address=proxy.address, key_column="id")
    with pytest.raises(
        Exception, match=r"DuplicateRowKeyError: key 1 of column 'id' appears twice"
    ):
        df.foreachPartition(sink)


@pytest.mark.timeout(480)
def test_example_writes_a_dataframe_through_the_proxy(
    broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    """``examples/spark_sink.py`` as a user runs it (plain ``python``, its own local Spark)."""
    uri = unique_uri("spark-example")
    command = [
        sys.executable,
        str(EXAMPLES / "spark_sink.py"),
        "--address",
        proxy.address,
        "--queue",
        uri,
        "--rows",
        "5000",
        "--run-id",
        "example-1",
        "--master",
        "local[2,4]",
    ]
    # Spark's own driver servers listen on loopback only, like every server a test starts.
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    # The test JVM options (helpers.JVM_OPTIONS) the way a user passes JVM options to a
    # plain-python PySpark program; the example itself is run unchanged.
    env["PYSPARK_SUBMIT_ARGS"] = f'--driver-java-options "{JVM_OPTIONS}" pyspark-shell'
    done = subprocess.run(command, capture_output=True, text=True, timeout=150, env=env)
    assert done.returncode == 0, f"spark_sink.py exited {done.returncode}:\n{done.stderr}"
    assert f"wrote 5000 rows to {uri} (run example-1)" in done.stdout
    # The same run id again: nothing is added, and the summary says so.
    again = subprocess.run(command, capture_output=True, text=True, timeout=150, env=env)
    assert again.returncode == 0, f"spark_sink.py exited {again.returncode}:\n{again.stderr}"
    assert f"wrote nothing new to {uri} (run example-1)" in again.stdout
    assert "wrote 5000 rows" not in again.stdout
    # The QueueSink mode replaying the run within the dedup window: the same messages
    # (properties too), so no CONFLICT and nothing added.
    replay = subprocess.run(
        [*command, "--foreach-partition"], capture_output=True, text=True, timeout=150, env=env
    )
    assert replay.returncode == 0, f"spark_sink.py exited {replay.returncode}:\n{replay.stderr}"
    messages = drain_messages(broker.address, uri, 5000)
    assert len(messages) == 5000
    assert len({json.loads(m.payload)["order_id"] for m in messages}) == 5000
    assert all(isinstance(m.guid, uuid.UUID) and m.guid.version == 8 for m in messages)

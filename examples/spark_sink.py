"""Write a Spark DataFrame into a Holdfast queue, exactly once under task retries.

    python examples/spark_sink.py --queue hf://demo/orders --rows 10000 --run-id orders-1
    spark-submit examples/spark_sink.py --queue hf://demo/orders --run-id orders-1

It builds a DataFrame of orders (``order_id``, ``customer``, ``amount``, ``day``)
and writes it through the local proxy (``--address``, default ``$HOLDFAST_ADDRESS``
or ``127.0.0.1:7701``) with ``df.write.format("holdfast")`` (or, with
``--foreach-partition``, ``df.foreachPartition(QueueSink(...))``). Each row's GUID
comes from the run id and its ``order_id``, so a task that Spark retries, or the whole
job run again with the same ``--run-id``, adds nothing to the queue: at any time with
the connector (the broker keeps the run's commit mark), within the broker's dedup window
with ``--foreach-partition`` (no commit mark on that path). Both modes write the same
message (the row as JSON, the ``order_id`` as the ``x-key`` property), so either may
replay a run the other wrote: a message with the same GUID and other properties would
be refused as a conflicting replay.

Run with plain ``python`` it starts Spark in local mode (``--master``, default
``local[2,4]``: two task slots, four attempts per task, so failed tasks are retried);
under ``spark-submit`` the master comes from spark-submit. The connector needs PySpark
>= 4.0, pyarrow (``pip install "holdfast-mq[spark]"``) and Java 17. Executors
need ``holdfast`` installed (and ``HOLDFAST_ADDRESS`` or ``--address`` reachable
from them).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from holdfast.sdk import Session
from holdfast.sdk.spark import QueueSink, register


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="default: $HOLDFAST_ADDRESS or :7701")
    parser.add_argument("--queue", default="hf://demo/orders")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--run-id", default="orders-1", help="the same run id again adds nothing to the queue"
    )
    parser.add_argument("--master", default=None, help="default local[2,4] without spark-submit")
    parser.add_argument(
        "--foreach-partition", action="store_true", help="write with QueueSink, not the connector"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")

    # With plain `python`, Spark's Python workers must run this interpreter (the one
    # that has holdfast installed), not whatever `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    builder = SparkSession.builder.appName("holdfast-spark-sink").config(
        "spark.ui.showConsoleProgress", "false"
    )
    if args.master:
        builder = builder.master(args.master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # plain python, not spark-submit
        builder = builder.master("local[2,4]")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        orders = spark.range(0, args.rows, numPartitions=args.partitions).select(
            F.col("id").alias("order_id"),
            F.concat(F.lit("customer-"), (F.col("id") % 97).cast("string")).alias("customer"),
            (F.col("id").cast("decimal(12,0)") / 100).cast("decimal(12,2)").alias("amount"),
            F.date_add(F.lit("2024-01-01").cast("date"), (F.col("id") % 31).cast("int")).alias(
                "day"
            ),
        )
        started = time.monotonic()
        replay = False
        # Both raise (after Spark's retries) unless every row was ACKed by the broker.
        if args.foreach_partition:
            sink = QueueSink(
                args.queue,
                run_id=args.run_id,
                address=args.address,
                key_column="order_id",
                # No properties_from: the connector writes none beyond x-key, and the
                # properties are part of what a replay of the same GUID must match.
            )
            orders.foreachPartition(sink)
        else:
            # A batch write commits under its run id (version 0): a mark already there
            # means this run was written before, and the write below adds nothing.
            with Session(args.address) as session:
                replay = session.commit_mark(args.queue, args.run_id) is not None
            register(spark)
            writer = (
                orders.write.format("holdfast")
                .option("uri", args.queue)
                .option("keyColumn", "order_id")
                .option("runId", args.run_id)
            )
            if args.address:
                writer = writer.option("address", args.address)
            writer.mode("append").save()
        elapsed = time.monotonic() - started
    finally:
        spark.stop()
    where = f"{args.queue} (run {args.run_id}) in {elapsed:.1f} s"
    if replay:
        print(f"wrote nothing new to {where}: this run id was committed before")
    elif args.foreach_partition:
        # No commit mark on this path: the broker ACKs a row it already holds as a
        # success, so "new" cannot be told from "already there" here.
        print(
            f"sent {args.rows} rows to {where}; those this run id wrote within the "
            "dedup window were not added again"
        )
    else:
        print(f"wrote {args.rows} rows to {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A Spark driver program for the tests that SIGKILL a driver: run as a subprocess.

``write-stream``: JSON files (one per micro-batch) -> ``writeStream.format("holdfast")``.
``read-stream``: ``readStream.format("holdfast")`` -> a ``foreachBatch`` sink that
writes each batch's GUIDs to ``<out>/batch-<id>.txt`` unless that file exists (an
idempotent sink by batch id, as Spark's exactly-once sinks are); with ``--hold-batch K``
it stops dead (sleeps) right after writing batch K, before Spark commits it, so the
test can kill the driver exactly there.

Both print ``progress <batchId>`` for every batch Spark has completed. SIGTERM stops
the query gracefully (``query.stop()``, then the SparkSession), prints ``stopped`` and
exits 0: a user's orderly shutdown, as against the tests' SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from holdfast.sdk.spark import register
from tests.spark.helpers import JVM_OPTIONS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["write-stream", "read-stream"])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--source", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--wal", default="")
    parser.add_argument("--hold-batch", type=int, default=-1)
    args = parser.parse_args()
    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("holdfast-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    if args.mode == "write-stream":
        stream = (
            spark.readStream.schema("order_id LONG, item STRING")
            .option("maxFilesPerTrigger", 1)
            .json(args.source)
        )
        query = (
            stream.writeStream.format("holdfast")
            .option("uri", args.uri)
            .option("address", args.address)
            .option("keyColumn", "order_id")
            .option("checkpointLocation", args.checkpoint)
            .trigger(processingTime="0.5 seconds")
            .start()
        )
    else:
        reader = (
            spark.readStream.format("holdfast")
            .option("uri", args.uri)
            .option("address", args.address)
            .option("maxRowsPerBatch", 500)
        )
        if args.wal:
            reader = reader.option("walPath", args.wal)
        out, hold = Path(args.out), args.hold_batch

        def sink(df: Any, batch_id: int) -> None:
            target = out / f"batch-{batch_id}.txt"
            if not target.exists():
                guids = sorted(row.guid for row in df.select("guid").collect())
                temporary = out / f".batch-{batch_id}.tmp"
                temporary.write_text("".join(g + "\n" for g in guids))
                os.replace(temporary, target)
            if batch_id == hold:
                print(f"holding {batch_id}", flush=True)
                while True:
                    time.sleep(1)  # waits to be SIGKILLed by the test

        query = (
            reader.load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", args.checkpoint)
            .trigger(processingTime="0.5 seconds")
            .start()
        )
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    reported = -1
    while query.isActive and not stopping:
        progress = query.lastProgress
        if progress is not None and progress["batchId"] > reported:
            reported = progress["batchId"]
            print(f"progress {reported}", flush=True)
        time.sleep(0.2)
    if stopping:
        query.stop()
        spark.stop()
        print("stopped", flush=True)
        sys.exit(0)
    print(f"query ended: {query.exception()}", file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()

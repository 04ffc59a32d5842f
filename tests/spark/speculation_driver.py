"""A Spark driver program for the speculation test: run as a subprocess against a
standalone cluster (``cluster.StandaloneCluster``), because each test process has a
local SparkSession already and a process can hold one only.

It waits for two executors, then runs each write of ``--writes`` (a JSON list of
``{"label", "uri", "address", "key_column"}``) in turn: ``--rows`` rows
(``order_id``, ``amount``, ``note``) in ``--partitions`` partitions through
``faults.Straggler`` (partition ``--slow-partition``'s first attempt stalls after
``--after`` rows; its copy waits for the broker at ``--metrics`` to show the
original's rows staged) into ``format("holdfast")``, with speculation on. After each
write it creates ``<markers>/<label>/written`` (the straggler's cue to go on), waits
until none of the write's tasks runs any more, and prints ``tasks <label> <JSON>``:
every task attempt as Spark's status store recorded it (partition, attempt,
speculative, host, status, error). Prints ``done`` at the end and exits 0.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from holdfast.sdk.spark import register
from tests.spark import faults
from tests.spark.helpers import JVM_OPTIONS

cloudpickle.register_pickle_by_value(faults)  # type: ignore[no-untyped-call]

EXECUTORS_TIMEOUT = 90.0
"""Seconds both Workers may take to start their executors for this application."""

TASKS_END_TIMEOUT = 60.0
"""Seconds the write's last task attempts may take to end once the write returned."""

SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
    # Spark 3.4+ copies only tasks it finds "inefficient" (slow for their input
    # size); a task stalled with little input read may not count as that.
    "spark.speculation.efficiency.enabled": "false",
}


def session(master: str) -> Any:
    """The SparkSession on the cluster, once both executors registered."""
    builder = (
        SparkSession.builder.master(master)
        .appName("holdfast-speculation")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        # Small Arrow batches reach the writer as soon as the rows are made, so the
        # straggler's first rows are staged before it stalls.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    )
    for key, value in SPECULATION.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    jsc = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + EXECUTORS_TIMEOUT
    while jsc.getExecutorIds().size() < 2:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {jsc.getExecutorIds().size()} executors registered")
        time.sleep(0.1)
    return spark


def task_attempts(spark: Any, group: str) -> list[dict[str, Any]]:
    """Every task attempt of the jobs of ``group``, from the driver's status store."""
    context = spark.sparkContext
    store = context._jsc.sc().statusStore()
    attempts = []
    for job in context.statusTracker().getJobIdsForGroup(group):
        info = context.statusTracker().getJobInfo(job)
        for stage in info.stageIds if info is not None else []:
            tasks = store.taskList(stage, 0, 10_000)
            for n in range(tasks.size()):
                task = tasks.apply(n)
                error = task.errorMessage()
                attempts.append(
                    {
                        "partition": task.index(),
                        "attempt": task.attempt(),
                        "speculative": task.speculative(),
                        "host": task.host(),
                        "status": task.status(),
                        "error": error.get().splitlines()[0] if error.isDefined() else "",
                    }
                )
    return attempts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--writes", required=True)
    parser.add_argument("--markers", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--slow-partition", type=int, required=True)
    parser.add_argument("--after", type=int, required=True)
    parser.add_argument("--stall", type=float, required=True)
    parser.add_argument("--note", default="''", help="SQL for a string column of each row")
    parser.add_argument("--metrics", required=True, help="the broker's metrics HOST:PORT")
    args = parser.parse_args()
    spark = session(args.master)
    register(spark)
    for write in json.loads(args.writes):
        label = write["label"]
        markers = Path(args.markers) / label
        markers.mkdir(parents=True)
        # Before the copy runs, every other partition has staged its rows: the one
        # executor slot not held by the stalled original ran them first.
        others = args.rows - args.rows // args.partitions
        fault = faults.Straggler(
            str(markers),
            args.slow_partition,
            args.after,
            args.stall,
            f"http://{args.metrics}/metrics",
            others,
        )
        df = spark.range(0, args.rows, numPartitions=args.partitions).selectExpr(
            "id AS order_id", "id * 3 AS amount", f"{args.note} AS note"
        )
        df = spark.createDataFrame(df.rdd.mapPartitions(fault), df.schema)
        writer = (
            df.write.format("holdfast")
            .option("uri", write["uri"])
            .option("address", write["address"])
            .mode("append")
        )
        if write["key_column"]:
            writer = writer.option("keyColumn", write["key_column"])
        spark.sparkContext.setJobGroup(label, f"speculative copy: {label}")
        writer.save()
        (markers / "written").write_text("")
        deadline = time.monotonic() + TASKS_END_TIMEOUT
        attempts = task_attempts(spark, label)
        while any(a["status"] == "RUNNING" for a in attempts) and time.monotonic() < deadline:
            time.sleep(0.1)
            attempts = task_attempts(spark, label)
        print(f"tasks {label} {json.dumps(attempts)}", flush=True)
    spark.stop()
    print("done", flush=True)


if __name__ == "__main__":
    main()

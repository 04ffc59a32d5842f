"""Rows per second per task of ``df.write.format("holdfast")``, direct and through the proxy.

    .venv/bin/python bench/spark.py [--rows N] [--partitions P]

Starts a broker (memory store) and a proxy, then for each path runs a Spark driver in a
subprocess (``local[P,4]``) that writes ``N`` rows over ``P`` partitions with the
connector, twice (the first run warms the JVM and the Python workers up; only the
second counts). Each task's rows and seconds come from the line the connector's commit
logs on the driver (``p<i>: <rows> rows in <s> s``), so the figure is the task's own
time: staging its rows with the broker (or, on a broker that cannot stage, posting them
and waiting for every ACK); the driver's commit, which publishes the staged rows, is
printed beside it (``commit <s> s``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Any

import harness

TASK_LINE = re.compile(r"p(\d+): (\d+) rows in ([\d.]+) s")
COMMIT_LINE = re.compile(r"committed .*: (\d+) rows from .*; commit ([\d.]+) s")
DRIVER_TIMEOUT = 600.0


def driver(address: str, uri: str, rows: int, partitions: int) -> None:
    """The driver subprocess: two writes, the second one measured."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from holdfast.sdk.spark import register

    spark = (
        SparkSession.builder.master(f"local[{partitions},4]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    df = spark.range(0, rows, numPartitions=partitions).select(
        F.col("id").alias("order_id"),
        F.concat(F.lit("customer-"), (F.col("id") % 97).cast("string")).alias("customer"),
    )
    for run in ("warm-up", "measured"):
        print(f"run {run}", file=sys.stderr, flush=True)
        df.write.format("holdfast").option("uri", uri).option("address", address).option(
            "keyColumn", "order_id"
        ).mode("append").save()
    spark.stop()


def measure(address: str, uri: str, rows: int, partitions: int) -> dict[str, Any]:
    """Run the driver subprocess; return per-task rates of the measured run."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    command = [sys.executable, __file__, "--driver", address, uri, str(rows), str(partitions)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=DRIVER_TIMEOUT, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Spark driver exited {done.returncode}: {done.stderr[-2000:]}")
    measured = done.stderr.split("run measured", 1)[1]
    tasks = [(int(n), float(s)) for _, n, s in TASK_LINE.findall(measured)]
    rates = [n / s for n, s in tasks if s > 0]
    commit = COMMIT_LINE.search(measured)
    return {
        "rows": rows,
        "tasks": len(tasks),
        "per_task_rates": rates,
        "mean_per_task": sum(rates) / len(rates) if rates else float("nan"),
        "commit_seconds": float(commit.group(2)) if commit else float("nan"),
    }


def run(rows: int, partitions: int) -> list[dict[str, Any]]:
    """Both paths; the servers are stopped by PID when done."""
    results: list[dict[str, Any]] = []
    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
    ):
        paths = (("Spark->broker", broker.address), ("Spark->proxy->broker", proxy.address))
        for path, address in paths:
            result = measure(address, f"hf://bench/spark-{len(results)}", rows, partitions)
            results.append({"path": path, **result})
    return results


def main() -> int:
    """Command-line entry point."""
    if len(sys.argv) > 1 and sys.argv[1] == "--driver":
        address, uri, rows, partitions = sys.argv[2:6]
        driver(address, uri, int(rows), int(partitions))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()
    for result in run(args.rows, args.partitions):
        rates = ", ".join(harness.rate(r) for r in result["per_task_rates"])
        print(
            f"{result['path']}: {result['rows']} rows, {result['tasks']} tasks, "
            f"{harness.rate(result['mean_per_task'])} rows/s per task ({rates}); "
            f"the driver's commit (publishing the staged rows) {result['commit_seconds']:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make bench``: Holdfast's throughput, latency, recovery and memory figures in one run.

    .venv/bin/python bench/run.py [--small-count N] [--large-count N] [--repeats N]

Everything runs on this machine, side by side, against a broker and a proxy started
as subprocesses on free ports of 127.0.0.1 (stopped by PID however the run ends):

1. PUT->ACK: one producer (``Session``, ``queue.post`` -> the queue's ``on_ack``),
   100-byte and 10-KiB messages, SDK->broker and SDK->proxy->broker, with the memory
   store and the sqlite store (``--sync full``, in a temporary directory);
2. PUSH->CONFIRM: one consumer draining the queue the producer run just filled;
3. the raw ceiling: a batched gRPC echo on raw bytes (``bench/echo.py``), same count,
   size and batch size as our PUT frames, and our figures as a ratio of it;
4. recovery: the broker cut under a steady producer (``bench/recovery.py``);
5. SDK memory per buffered PUT, in a subprocess (``bench/memory.py``);
   broker memory per GUID held in the dedup history, and what a default broker holds
   at 100k msg/s (``bench/history.py``); the proxy's RSS through a broker outage
   flood against its ``--max-buffer-bytes`` (``bench/proxy_memory.py``);
6. NATS JetStream with the same 100-byte publish-with-ack load, if one listens on
   127.0.0.1:4222 (``bench/natsload.py``);
7. request/reply through the proxy and direct (calls/s, p50/p99 round trip) beside a
   plain gRPC unary call (``bench/rpcload.py``); request data streams: 1 GB caller ->
   broker -> worker, directly and through a proxy, MB/s and the peak RSS of caller,
   proxy, broker and worker (``bench/streamload.py``).
8. Spark: rows/s per task of ``df.write.format("holdfast")``, direct and through the
   proxy, beside a plain redis-py ``XADD`` pipeline from the same executors
   (``bench/spark.py``; ``--spark-rows 0`` skips it).
9. OpenTelemetry: a producer's ``post()`` cost with telemetry off, with the API and
   no provider, sampled at 1 % and every span recorded (``bench/otelcost.py``); and
   messages with the four properties of a traced request against none, PUT->ACK and
   PUSH->CONFIRM, direct and through the proxy (``bench/properties.py``).
10. Issue #33 before/after: this tree against ``--columnar-baseline`` (the last tree
   before the columnar wire),
   PUT->ACK direct and sidecar against JetStream, bytes per message, and callgrind
   instructions per message per hop (``bench/columnar.py``).

It prints tables to stdout (progress to stderr) and writes ``bench-results.json``.
Targets are printed with PASS or MISS: these are figures, not tests, so the exit
status is 0 whenever every measurement ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any, TypeVar

import columnar
import echo
import harness
import history
import loads
import memory
import natsload
import otelcost
import properties
import proxy_memory
import recovery
import rpcload
import scale
import spark
import streamload
from harness import rate
from report import (
    LARGE,
    PATHS,
    SMALL,
    issue_20_targets,
    print_echo,
    print_history,
    print_loads,
    print_memory,
    print_nats,
    print_otel,
    print_recovery,
    print_rpc,
    print_scale,
    print_targets,
    rpc_targets,
    summary,
)

T = TypeVar("T")


ECHO_SWEEP = (1, 10, 30, 100, 1000)
"""Messages per frame of the echo's context rows."""

TARGET_PROXY_RATE = 70_000
TARGET_DIRECT_RATE = 100_000
TARGET_ECHO_SHARE = 0.30
TARGET_STALL_MARGIN = 0.3


def progress(text: str) -> None:
    """A progress line on stderr (stdout carries the tables)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(harness.REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": metadata.version("grpcio"),
        "protobuf": metadata.version("protobuf"),
        "platform": platform.platform(),
        "loadavg_at_start": load_average(),
        "commit": commit or "unknown",
    }


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (other work on the machine skews figures)."""
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


# ---------------------------------------------------------------------------- PUT/PUSH loads


def run_loads(args: argparse.Namespace, directory: str) -> dict[str, Any]:
    """Producer and consumer runs for every store, size and path, plus idle round trips."""
    produced: list[dict[str, Any]] = []
    consumed: list[dict[str, Any]] = []
    idle: list[dict[str, Any]] = []
    sizes = ((SMALL, args.small_count), (LARGE, args.large_count))
    for store in (harness.memory_store(), harness.sqlite_store(directory)):
        with (
            harness.running_broker(store) as broker,
            harness.running_proxy(broker.address) as proxy,
        ):
            targets = {
                PATHS[0]: (broker.address, {"broker": broker.pid}),
                PATHS[1]: (proxy.address, {"proxy": proxy.pid, "broker": broker.pid}),
            }
            for size, count in sizes:
                for path, (address, pids) in targets.items():
                    runs_p: list[loads.ProduceResult] = []
                    runs_c: list[loads.ConsumeResult] = []
                    for run in range(args.repeats):
                        uri = f"hf://bench/{store.label}-{size}-{len(produced)}-{run}"
                        cpu = loads.CpuMeter(pids)
                        p = loads.produce(address, uri, count, size, cpu)
                        runs_p.append(p)
                        c = loads.consume(address, uri, count, size, cpu)
                        runs_c.append(c)
                        progress(
                            f"{store.label:6} {size:5} B {path:18} run {run + 1}/{args.repeats}: "
                            f"PUT->ACK {rate(p.rate)}/s, PUSH->CONFIRM {rate(c.rate)}/s"
                        )
                    key = {"store": store.label, "size": size, "path": path, "count": count}
                    produced.append({**key, "runs": [dataclasses.asdict(r) for r in runs_p]})
                    consumed.append({**key, "runs": [dataclasses.asdict(r) for r in runs_c]})
            for path, (address, _) in targets.items():
                latencies = loads.idle_round_trips(
                    address, f"hf://bench/idle-{store.label}-{len(idle)}", args.idle_count, SMALL
                )
                idle.append(
                    {
                        "store": store.label,
                        "size": SMALL,
                        "path": path,
                        "count": len(latencies),
                        "p50": harness.percentile(latencies, 50),
                        "p99": harness.percentile(latencies, 99),
                    }
                )
                progress(f"{store.label:6} idle round trips {path}: done")
    return {"produce": produced, "consume": consumed, "idle": idle}


def run_echo(args: argparse.Namespace, batches: dict[int, int]) -> list[dict[str, Any]]:
    """The raw gRPC echo for each size, with the batch size our SDK used."""
    results = []
    counts = {SMALL: args.small_count, LARGE: args.large_count}
    with harness.ScriptServer("echo.py", ["--listen", "127.0.0.1:0"]) as server:
        for size, batch in batches.items():
            rates = [
                echo.echo_rate(server.address, counts[size], size, batch)
                for _ in range(args.repeats)
            ]
            results.append(
                {
                    "size": size,
                    "count": counts[size],
                    "batch": batch,
                    "rates": rates,
                    "rate": harness.median(rates),
                }
            )
            progress(f"echo {size} B x{batch}/frame: {rate(harness.median(rates))}/s")
        # Context: the echo's rate by frame size, 100-byte messages, ~2000 frames each,
        # to show what the per-frame cost is and which frame size a rate corresponds to.
        for batch in ECHO_SWEEP:
            count = min(args.small_count, batch * 2000)
            results.append(
                {
                    "size": SMALL,
                    "count": count,
                    "batch": batch,
                    "sweep": True,
                    "rates": [echo.echo_rate(server.address, count, SMALL, batch)],
                }
            )
            results[-1]["rate"] = results[-1]["rates"][0]
        progress("echo by frame size: done")
    return results


def run_recovery(directory: str) -> list[dict[str, Any]]:
    """The three recovery runs."""
    results = []
    for via_proxy, cut in ((False, "kill"), (True, "kill"), (True, "stop")):
        result = recovery.run_recovery(directory, via_proxy, cut)
        results.append({**dataclasses.asdict(result), "budget": result.budget})
        progress(f"recovery {result.path} {cut}: stall {result.stall:.3f} s")
    return results


def run_nats(args: argparse.Namespace) -> dict[str, Any]:
    """JetStream with the same 100-byte load, if a server listens on 127.0.0.1:4222."""
    if not natsload.reachable():
        return {"skipped": "no NATS server on 127.0.0.1:4222"}
    try:
        import nats  # noqa: F401
    except ImportError:
        return {"skipped": "nats-py is not installed (make bench installs the bench extra)"}
    results = []
    for storage in ("memory", "file"):
        try:
            outcome = natsload.publish(args.small_count, SMALL, storage)
        except Exception as error:  # the server's business (JetStream off, limits...)
            return {"skipped": f"the NATS server at 127.0.0.1:4222 failed the run: {error!r}"}
        results.append(dataclasses.asdict(outcome))
        progress(f"NATS JetStream {storage}: {rate(outcome.rate)}/s")
    return {"runs": results}


# ---------------------------------------------------------------------------- printing


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small-count", type=int, default=200_000, help="100-byte messages")
    parser.add_argument("--large-count", type=int, default=20_000, help="10-KiB messages")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration")
    parser.add_argument("--idle-count", type=int, default=300, help="idle round trips")
    parser.add_argument("--memory-count", type=int, default=1_000_000, help="buffered PUTs")
    parser.add_argument(
        "--proxy-bound-mib", type=int, default=256, help="proxy --max-buffer-bytes, MiB"
    )
    parser.add_argument("--rpc-count", type=int, default=20000, help="request/reply calls")
    parser.add_argument(
        "--spark-rows", type=int, default=100_000, help="rows per connector write (0: skip)"
    )
    parser.add_argument(
        "--scale-count", type=int, default=60_000, help="messages per growth-curve point (0: skip)"
    )
    parser.add_argument("--depth", type=int, default=1_000_000, help="messages held unconsumed")
    parser.add_argument("--redis-count", type=int, default=100_000, help="Redis store messages")
    parser.add_argument("--otel-count", type=int, default=50_000, help="traced posts per mode")
    parser.add_argument(
        "--columnar-baseline",
        default=columnar.BEFORE,
        help="issue #33 before/after against this git ref (bench/columnar.py; default: "
        "the last tree before the columnar wire); '' skips it",
    )
    parser.add_argument("--json", default=str(harness.REPO / "bench-results.json"))
    return parser.parse_args(argv)


def guarded(name: str, failures: list[str], run: Callable[[], T], fallback: T) -> T:
    """Run one section; if it fails, say so on stderr, note it, and go on with the rest."""
    try:
        return run()
    except Exception as error:
        failures.append(f"{name}: {error!r}")
        progress(f"{name} FAILED: {error!r}")
        return fallback


def main(argv: list[str] | None = None) -> int:
    """Run every section, print the tables, write the JSON file. Exit status 1 if a
    section could not be measured (a missed target is not a failure)."""
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every server we started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    info = machine()
    print(
        f"Holdfast bench at {info['commit']}: {info['cpus']} CPUs, Python {info['python']}, "
        f"grpcio {info['grpcio']}, protobuf {info['protobuf']}; "
        f"load average {info['loadavg_at_start']}"
    )
    print(
        f"messages per run: {args.small_count} x {SMALL} B, {args.large_count} x {LARGE} B; "
        f"{args.repeats} runs per configuration; memory: {args.memory_count} buffered PUTs"
    )
    sys.stdout.flush()
    results: dict[str, Any] = {"machine": info, "arguments": vars(args)}
    failures: list[str] = []
    no_rows: list[dict[str, Any]] = []
    no_result: dict[str, Any] = {}
    with harness.temp_dir() as directory:
        # The loads are the point of the bench: if they fail, the run fails.
        figures = run_loads(args, directory)
        results["loads"] = figures
        batches = {
            entry["size"]: max(1, round(summary(entry)["mean_batch"]))
            for entry in figures["produce"]
            if entry["store"] == "memory" and entry["path"] == PATHS[0]
        }
        results["echo"] = guarded("echo", failures, lambda: run_echo(args, batches), no_rows)
        results["recovery"] = guarded(
            "recovery", failures, lambda: run_recovery(directory), no_rows
        )
    progress("memory per buffered PUT (subprocess)")
    results["memory"] = guarded(
        "memory",
        failures,
        lambda: memory.measure_in_subprocess(args.memory_count, SMALL),
        no_result,
    )
    progress("proxy RSS through an outage flood (subprocess)")
    results["proxy_memory"] = guarded(
        "proxy memory",
        failures,
        lambda: proxy_memory.measure_in_subprocess(args.proxy_bound_mib * 1024 * 1024),
        no_result,
    )
    progress("broker memory per GUID in the dedup history (subprocess)")
    results["history"] = guarded(
        "history", failures, lambda: history.measure_in_subprocess(1_000_000), no_result
    )
    results["nats"] = run_nats(args)
    progress("request/reply and plain gRPC unary")
    results["rpc"] = guarded(
        "request/reply",
        failures,
        lambda: [dataclasses.asdict(f) for f in rpcload.measure(args.rpc_count)],
        no_rows,
    )
    progress("request data streams: 1 GB caller -> broker -> worker, direct and via a proxy")
    results["streams"] = guarded("streams", failures, streamload.measure, no_result)
    progress("OpenTelemetry cost per post (subprocesses)")
    results["otel"] = guarded(
        "otel", failures, lambda: otelcost.measure_all(args.otel_count), no_rows
    )
    progress("messages with properties against none")
    results["properties"] = guarded(
        "properties",
        failures,
        lambda: properties.measure(args.small_count // 2, args.repeats),
        no_rows,
    )
    results["scale"] = scale.run_all(args, failures, guarded, progress)
    if args.spark_rows:
        progress("Spark connector (driver subprocesses)")
        results["spark"] = guarded(
            "spark", failures, lambda: spark.run(args.spark_rows, 2), no_rows
        )

    echo_rates = {row["size"]: row["rate"] for row in results["echo"] if not row.get("sweep")}
    print_loads(figures, echo_rates)
    if results["echo"]:
        print_echo(results["echo"])
    if results["recovery"]:
        print_recovery(results["recovery"])
    if results["memory"]:
        print_memory(results["memory"])
    if results["proxy_memory"]:
        proxy_memory.print_proxy_memory(results["proxy_memory"])
    if results["history"]:
        print_history(results["history"])
    if results["rpc"]:
        print_rpc(results["rpc"])
    if results["streams"]:
        print("\n" + "\n".join(streamload.describe(results["streams"])))
    if results["otel"]:
        print_otel(results["otel"])
    if results["properties"]:
        print("\n".join(properties.describe(results["properties"])))
    if results.get("spark"):
        print("\nSpark connector, rows/s per task (df.write.format('holdfast') stages its rows)")
        for line in spark.report(results["spark"]):
            print(line)
    rates = {(e["store"], e["size"], e["path"]): summary(e)["median"] for e in figures["produce"]}
    print_nats(
        results["nats"],
        {store: rates[(store, SMALL, PATHS[0])] for store in ("memory", "sqlite")},
    )

    direct = rates[("memory", SMALL, PATHS[0])]
    proxied = rates[("memory", SMALL, PATHS[1])]
    echo_small = echo_rates.get(SMALL, math.nan)
    targets = [
        (
            "SDK->proxy->broker, 100 B, memory >= 70k msg/s",
            f"{rate(proxied)}/s",
            proxied >= TARGET_PROXY_RATE,
        ),
        (
            "SDK->broker, 100 B, memory >= 100k msg/s",
            f"{rate(direct)}/s",
            direct >= TARGET_DIRECT_RATE,
        ),
        (
            "SDK->broker, 100 B, memory >= 30% of the raw echo",
            f"{direct / echo_small:.0%} of {rate(echo_small)}/s",
            direct / echo_small >= TARGET_ECHO_SHARE,
        ),
        (
            "SDK->proxy->broker, 100 B, memory >= 30% of the raw echo",
            f"{proxied / echo_small:.0%} of {rate(echo_small)}/s",
            proxied / echo_small >= TARGET_ECHO_SHARE,
        ),
    ]
    for row in results["recovery"]:
        targets.append(
            (
                f"recovery {row['path']} ({row['cut']}): stall <= outage + 0.3 s",
                f"{row['stall']:.3f} s vs {row['budget']:.3f} s",
                row["stall"] <= row["budget"],
            )
        )
    print_scale(results["scale"])
    consume = {(e["store"], e["size"], e["path"]): summary(e)["median"] for e in figures["consume"]}
    targets += issue_20_targets(
        rates, consume, results["nats"], results["memory"], results["scale"], results["history"]
    )
    flood = results["proxy_memory"]
    if flood:
        targets.append(
            (
                "proxy RSS through an outage flood <= --max-buffer-bytes + 64 MiB",
                f"{flood['rss_peak'] / 2**20:.0f} MiB vs {flood['target_rss'] / 2**20:.0f} MiB",
                flood["rss_peak"] <= flood["target_rss"] and flood["pushed_back"],
            )
        )
    targets += rpc_targets(results["rpc"])
    targets += spark.targets(results.get("spark", []))
    print_targets(targets)
    if args.columnar_baseline:
        progress(f"issue #33 before/after against {args.columnar_baseline}...")
        columns: dict[str, Any] = guarded(
            "columnar",
            failures,
            lambda: columnar.run_all(args.columnar_baseline, None, 100_000, 2, 3000),
            {"lines": []},
        )
        print("\n".join(columns.pop("lines")))
        results["columnar"] = columns
    results["targets"] = [{"target": t, "figure": f, "pass": ok} for t, f, ok in targets]
    results["failures"] = failures

    elapsed = time.monotonic() - started
    results["seconds"] = elapsed
    results["loadavg_at_end"] = load_average()
    with open(args.json, "w") as out:
        json.dump(_finite(results), out, indent=2)
    print()
    for failure in failures:
        print(f"FAILED to measure {failure}")
    print(
        f"bench finished in {elapsed:.0f} s (load average now {results['loadavg_at_end']}); "
        f"results in {os.path.relpath(args.json)}"
    )
    return 1 if failures else 0


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None, so the file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


if __name__ == "__main__":
    sys.exit(main())

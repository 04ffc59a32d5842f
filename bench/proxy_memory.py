"""The proxy's resident memory through a broker outage flood, against its buffer bound.

As a script (``python bench/proxy_memory.py --bound 268435456``) it starts a broker and
a proxy (``--max-buffer-bytes``), opens a queue through the proxy, SIGKILLs the broker,
and posts 1-KiB messages through the proxy as fast as one ``Session`` can until the
proxy pushes back (the post raises ``BandwidthLimitError``) or ``--limit`` messages
were taken, then starts the broker again and waits until every PUT is ACKed. A thread
samples the proxy's RSS (``/proc/PID/statm``) all along; one JSON line gives its peak,
through the outage and its end, beside the bound (target: peak RSS <= bound + 64 MiB), what the
proxy accounted (its ``holdfast_proxy_buffered_bytes_peak`` gauge), and the proxy's
RSS growth per PUT it holds, beside what it charges one (``PUT_BOOKKEEPING_BYTES`` +
payload).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import harness

from holdfast.proxy.budget import PUT_BOOKKEEPING_BYTES
from holdfast.sdk import BandwidthLimitError, Session, SessionOptions
from tests.support.metrics import metrics_address, scrape, value
from tests.support.processes import BrokerProcess, ProxyProcess

MIB = 1024 * 1024
TARGET_MARGIN = 64 * MIB
"""Peak RSS may pass the bound by this much (the interpreter, gRPC, the code)."""


def process_rss(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssSampler(threading.Thread):
    """Samples a process's RSS every 20 ms until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.02):
            try:
                self.peak = max(self.peak, process_rss(self.pid))
            except OSError:
                return

    def stop(self) -> None:
        self._done.set()
        self.join(5)


def gauge(metrics: str, name: str) -> float:
    """One of the proxy's gauges now (NaN if it serves none)."""
    number = value(scrape(metrics), name)
    return float("nan") if number is None else number


def measure(bound: int, size: int, limit: int) -> dict[str, Any]:
    """Flood the proxy during an outage; its RSS against ``bound``."""
    broker = BrokerProcess(["--store", "memory"])
    proxy = ProxyProcess([])
    try:
        broker.start()
        proxy.args = ["--upstream", broker.address, "--max-buffer-bytes", str(bound)]
        proxy.args += ["--metrics-port", "0"]
        proxy.start()
        metrics = metrics_address(proxy)
        options = SessionOptions(close_timeout=0)
        with Session(proxy.address, on_event=lambda event: None, options=options) as session:
            queue = session.open_queue("hf://bench/proxy-flood", write=True)
            broker.kill()
            deadline = time.monotonic() + 10
            while gauge(metrics, "holdfast_proxy_upstream_connected") and time.monotonic() < (
                deadline
            ):
                time.sleep(0.01)
            before = process_rss(proxy.pid)
            sampler = RssSampler(proxy.pid)
            sampler.start()
            prefix = bytes(size - 8)
            taken = 0
            pushed_back = False
            started = time.perf_counter()
            try:
                while taken < limit:
                    queue.post(taken.to_bytes(8, "big") + prefix)
                    taken += 1
            except BandwidthLimitError:
                pushed_back = True
            seconds = time.perf_counter() - started
            held = gauge(metrics, "holdfast_proxy_pending_puts")
            accounted_peak = gauge(metrics, "holdfast_proxy_buffered_bytes_peak")
            after = process_rss(proxy.pid)
            outage_peak = max(sampler.peak, after)
            # Through the outage means through its end too: the proxy sends its whole
            # buffer again while the client's own backlog arrives.
            broker.restart()
            recovered = session.flush(timeout=300)
            sampler.stop()
    finally:
        harness.stop_server(proxy)
        harness.stop_server(broker)
    peak = max(sampler.peak, outage_peak)
    return {
        "bound": bound,
        "size": size,
        "taken_by_client": taken,
        "held_by_proxy": held,
        "pushed_back": pushed_back,
        "seconds": seconds,
        "rss_before": before,
        "rss_peak": peak,
        "rss_peak_outage": outage_peak,
        "recovered": recovered,
        "accounted_peak": accounted_peak,
        "rss_per_put": (after - before) / held if held else float("nan"),
        "charged_per_put": size + PUT_BOOKKEEPING_BYTES,
        "target_rss": bound + TARGET_MARGIN,
    }


def measure_in_subprocess(bound: int, size: int = 1024, limit: int = 2_000_000) -> dict[str, Any]:
    """``measure`` in a fresh interpreter (the flooding client's buffers stay there)."""
    args = ["--bound", str(bound), "--size", str(size), "--limit", str(limit)]
    proc = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"proxy memory measurement failed ({proc.returncode}):\n{proc.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def print_proxy_memory(result: dict[str, Any]) -> None:
    """The table of the outage flood."""
    table = harness.Table(
        "Proxy RSS through a broker outage: one client floods 1-KiB PUTs",
        [
            "bound",
            "PUTs held",
            "pushed back",
            "accounted peak",
            "RSS before",
            "RSS peak, outage",
            "RSS peak, through its end",
        ],
    )
    table.add(
        f"{result['bound'] / MIB:.0f} MiB",
        f"{result['held_by_proxy']:.0f}",
        "yes" if result["pushed_back"] else "NO",
        f"{result['accounted_peak'] / MIB:.0f} MiB",
        f"{result['rss_before'] / MIB:.0f} MiB",
        f"{result['rss_peak_outage'] / MIB:.0f} MiB",
        f"{result['rss_peak'] / MIB:.0f} MiB"
        + ("" if result["recovered"] else " (not every PUT ACKed)"),
    )
    table.notes = [
        f"RSS growth per PUT held: {result['rss_per_put']:.0f} B; charged per PUT: "
        f"{result['charged_per_put']} B (payload + PUT_BOOKKEEPING_BYTES).",
        "The client's post() raised BandwidthLimitError once the proxy stopped reading it.",
        f"Target peak RSS <= bound + 64 MiB = {result['target_rss'] / MIB:.0f} MiB: "
        + ("PASS" if result["rss_peak"] <= result["target_rss"] else "MISS")
        + ".",
    ]
    harness.print_table(table)


def main() -> int:
    """Print the measurement as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=int, default=256 * MIB)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--limit", type=int, default=2_000_000)
    args = parser.parse_args()
    print(json.dumps(measure(args.bound, args.size, args.limit)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

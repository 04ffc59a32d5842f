"""Request data streams: 1 GB from a caller process to a worker process through a
broker (memory store), the worker checking its SHA-256, directly and with both ends
behind a proxy; prints MB/s and the peak RSS (``VmHWM``) of the caller and the worker
(each reports its own), of the broker and of the proxy (read from ``/proc``)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import harness

from holdfast.sdk import Request, Session, Worker

URI = "hf://bench/streams"
MB = 1024 * 1024
BLOCK = os.urandom(MB)


class _Source:
    """``size`` bytes made of a repeated random block, hashed as they are read."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.digest = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = BLOCK[: min(n, self.left, len(BLOCK))]
        self.left -= len(data)
        self.digest.update(data)
        return data


def _peak_rss_mb() -> float:
    """This process's peak RSS: ``VmHWM``, which starts afresh at exec. (``ru_maxrss``
    does not on Linux: a child of the ~330 MB ``bench/run.py`` reported 331.6 MB for a
    stream that, run alone, peaked at 57 MB.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: KiB


def _run_worker(address: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    def digest(request: Request) -> bytes:
        sha = hashlib.sha256()
        while chunk := request.streams["data"].read(MB):
            sha.update(chunk)
        return sha.hexdigest().encode()

    with Session(address) as session, Worker(session, URI, digest, concurrency=1):
        print("ready", flush=True)
        stop.wait()
    print(json.dumps({"worker_peak_rss_mb": round(_peak_rss_mb(), 1)}), flush=True)


def _run_caller(address: str, size: int) -> None:
    source = _Source(size)
    with Session(address) as session:
        started = time.perf_counter()
        reply = session.request(URI, b"", streams={"data": source}, timeout=3600)
        seconds = time.perf_counter() - started
    if reply.payload.decode() != source.digest.hexdigest():
        raise SystemExit("the worker's SHA-256 differs from the caller's")
    figures = {"seconds": round(seconds, 2), "mb_per_s": round(size / MB / seconds, 1)}
    figures["caller_peak_rss_mb"] = round(_peak_rss_mb(), 1)
    print(json.dumps(figures), flush=True)


def _vm_hwm_mb(pid: int) -> float:
    """The peak RSS of process ``pid`` so far, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _stream(address: str, size: int) -> dict[str, Any]:
    """One stream of ``size`` bytes from a caller to a worker, both at ``address``."""
    script = os.path.abspath(__file__)
    worker = subprocess.Popen(
        [sys.executable, script, "worker", address], stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None
    try:
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError("the stream bench worker did not start")
        caller = subprocess.run(
            [sys.executable, script, "caller", address, str(size)],
            capture_output=True,
            text=True,
            timeout=3600,
            check=True,
        )
        figures: dict[str, Any] = {"megabytes": size // MB}
        figures.update(json.loads(caller.stdout.strip().splitlines()[-1]))
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    figures.update(json.loads(out.strip().splitlines()[-1]))
    return figures


def measure(size: int = 1024 * MB) -> dict[str, Any]:
    """Stream ``size`` bytes caller -> broker -> worker, then again with caller and
    worker behind a proxy (each run on a fresh broker, so each peak is its own); the
    figures of the direct run, and those of the proxied run under ``"proxy"``."""
    with harness.running_broker(harness.memory_store()) as broker:
        figures = _stream(broker.address, size)
        figures["broker_peak_rss_mb"] = _vm_hwm_mb(broker.pid)
    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
    ):
        proxied = _stream(proxy.address, size)
        proxied["broker_peak_rss_mb"] = _vm_hwm_mb(broker.pid)
        proxied["proxy_peak_rss_mb"] = _vm_hwm_mb(proxy.pid)
    figures["proxy"] = proxied
    return figures


def describe(figures: dict[str, Any]) -> list[str]:
    """The figures as report lines."""
    lines = [f"request data stream, {figures['megabytes']} MB (peak RSS of each process):"]
    for name, run in (("direct", figures), ("via proxy", figures.get("proxy"))):
        if not run:
            continue
        peaks = ", ".join(
            f"{who} {run[f'{who}_peak_rss_mb']} MB"
            for who in ("caller", "proxy", "broker", "worker")
            if f"{who}_peak_rss_mb" in run
        )
        lines.append(f"  {name:9}: {run['mb_per_s']} MB/s; {peaks}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``worker ADDRESS``, ``caller ADDRESS SIZE``, or (no command) measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=["worker", "caller"])
    parser.add_argument("address", nargs="?")
    parser.add_argument("size", nargs="?", type=int, default=1024 * MB)
    args = parser.parse_args(argv)
    if args.command == "worker":
        _run_worker(args.address)
    elif args.command == "caller":
        _run_caller(args.address, args.size)
    else:
        print(json.dumps(measure(args.size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

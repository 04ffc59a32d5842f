"""SDK memory per buffered PUT, measured in a subprocess of its own.

As a script (``python bench/memory.py --count 1000000``) it starts a broker, opens
a queue for writing through ``holdfast.sdk.Session``, SIGKILLs the broker and waits
until the session knows the link is down, so that every PUT from then on is only
buffered (rule 2). It then posts ``count`` distinct 100-byte payloads and prints
one JSON line: the growth of its resident set size (``/proc/self/statm``) per PUT.

A payload is kept by the SDK until it is ACKed, so the growth includes the
payload object itself (``payload_object_bytes``); the rest is the SDK's own cost.

``measure_in_subprocess`` runs the script and returns that JSON, so the many
objects it creates do not distort the rest of the bench.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from typing import Any

import harness

from holdfast.sdk import Session, SessionOptions
from tests.support.processes import BrokerProcess


def measure(count: int, size: int) -> dict[str, Any]:
    """Post ``count`` PUTs while disconnected; RSS growth per PUT, in bytes."""
    broker = BrokerProcess(["--store", "memory"])
    try:
        broker.start()
        options = SessionOptions(close_timeout=0)
        with Session(broker.address, on_event=lambda event: None, options=options) as session:
            queue = session.open_queue("hf://bench/memory", write=True)
            broker.kill()
            deadline = time.monotonic() + 10
            while session.connected and time.monotonic() < deadline:
                time.sleep(0.01)
            if session.connected:
                raise RuntimeError("the session did not notice the broker was gone")
            prefix = bytes(size - 8)
            # Warm up allocator and code paths, so the baseline is not an empty heap.
            payloads = [i.to_bytes(8, "big") + prefix for i in range(1000)]
            for payload in payloads:
                queue.post(payload)
            del payloads
            gc.collect()
            before = harness.read_statm_rss()
            started = time.perf_counter()
            for i in range(count):
                queue.post(i.to_bytes(8, "big") + prefix)
            seconds = time.perf_counter() - started
            gc.collect()
            after = harness.read_statm_rss()
            pending = session.pending_count
            payload_object = sys.getsizeof(prefix + bytes(8))
    finally:
        harness.stop_server(broker)
    return {
        "count": count,
        "size": size,
        "pending": pending,
        "rss_before": before,
        "rss_after": after,
        "bytes_per_put": (after - before) / count,
        "payload_object_bytes": payload_object,
        "post_rate_disconnected": count / seconds,
    }


def measure_in_subprocess(count: int, size: int, timeout: float = 240.0) -> dict[str, Any]:
    """Run ``measure`` in a fresh interpreter; its JSON result."""
    proc = subprocess.run(
        [sys.executable, __file__, "--count", str(count), "--size", str(size)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"memory measurement failed ({proc.returncode}):\n{proc.stderr}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> int:
    """Print the measurement as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(measure(args.count, args.size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

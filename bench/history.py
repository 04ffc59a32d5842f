"""Broker memory per GUID held in the dedup history, measured in a subprocess.

As a script (``python bench/history.py --count 1000000``) it records ``count``
random 16-byte GUIDs with their content digests in one ``GuidHistory`` (as the PUT
path does: a fresh bytes object per GUID, as protobuf hands it over) and prints one
JSON line: the growth of its resident set size per GUID, and what that means for a
default broker: how many GUIDs its bound holds, and for how long at 100k msg/s. With
``--tracemalloc`` it gives the bytes the history allocated per GUID instead (what the
allocator's spare room and fragmentation add to RSS is then the difference).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tracemalloc
from typing import Any

import harness

from holdfast.broker.dedup import (
    DEFAULT_GRACE,
    DEFAULT_MAX_GUIDS,
    DEFAULT_WINDOW,
    BrokerClock,
    GuidHistory,
    HistoryBudget,
)

RATE = 100_000
"""The message rate the figures are given for."""

TARGET_BYTES_PER_GUID = 32
"""The target: a GUID held, with its digest and timestamp, in at most this many bytes."""


def measure_traced(count: int) -> float:
    """Record ``count`` GUIDs under tracemalloc; bytes allocated per GUID."""
    clock = BrokerClock()
    history = GuidHistory(budget=HistoryBudget(count + 1), clock=clock)
    gc.collect()
    tracemalloc.start()
    now = clock()
    record = history.record
    for i in range(count):
        record(os.urandom(16), i, now + DEFAULT_WINDOW * i / count)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return traced / count


def measure(count: int) -> dict[str, Any]:
    """Record ``count`` GUIDs; RSS growth per GUID, in bytes."""
    clock = BrokerClock()
    history = GuidHistory(budget=HistoryBudget(count + 1), clock=clock)
    gc.collect()
    before = harness.read_statm_rss()
    now = clock()
    record = history.record
    for i in range(count):
        # Spread over the window the way a steady stream is: one bucket after another.
        record(os.urandom(16), i, now + DEFAULT_WINDOW * i / count)
    gc.collect()
    after = harness.read_statm_rss()
    per_guid = (after - before) / count
    retention = DEFAULT_WINDOW + DEFAULT_GRACE
    return {
        "count": count,
        "bytes_per_guid": per_guid,
        "default_max_guids": DEFAULT_MAX_GUIDS,
        "default_bound_bytes": per_guid * DEFAULT_MAX_GUIDS,
        "rate": RATE,
        "retention_seconds": retention,
        "guids_for_full_retention": RATE * retention,
        "bytes_for_full_retention": per_guid * RATE * retention,
        "default_covers_seconds": DEFAULT_MAX_GUIDS / RATE,
        "target_bytes_per_guid": TARGET_BYTES_PER_GUID,
    }


def measure_in_subprocess(count: int) -> dict[str, Any]:
    """``measure`` in a fresh interpreter, and ``measure_traced`` in another; the JSON
    result of the first with ``traced_bytes_per_guid`` from the second."""
    results = []
    for extra in ([], ["--tracemalloc"]):
        output = subprocess.run(
            [sys.executable, __file__, "--count", str(count), *extra],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        ).stdout
        results.append(json.loads(output.strip().splitlines()[-1]))
    result: dict[str, Any] = {**results[0], **results[1]}
    return result


def main() -> None:
    """Print the measurement as one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--tracemalloc", action="store_true", help="bytes allocated, not RSS")
    args = parser.parse_args()
    if args.tracemalloc:
        print(json.dumps({"traced_bytes_per_guid": measure_traced(args.count)}))
    else:
        print(json.dumps(measure(args.count)))


if __name__ == "__main__":
    main()

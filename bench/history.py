"""Broker memory per GUID held in the dedup history, measured in a subprocess.

As a script (``python bench/history.py --count 1000000``) it records ``count``
random 16-byte GUIDs with their content digests in one ``GuidHistory`` (as the PUT
path does: a fresh bytes object per GUID, as protobuf hands it over) and prints one
JSON line: the growth of its resident set size per GUID, and what that means for a
default broker: how many GUIDs its bound holds, and for how long at 100k msg/s.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
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
    }


def measure_in_subprocess(count: int) -> dict[str, Any]:
    """``measure`` in a fresh interpreter; its JSON result."""
    output = subprocess.run(
        [sys.executable, __file__, "--count", str(count)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def main() -> None:
    """Print the measurement as one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1_000_000)
    print(json.dumps(measure(parser.parse_args().count)))


if __name__ == "__main__":
    main()

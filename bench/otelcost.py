"""What OpenTelemetry costs a producer, each set-up in a subprocess of its own.

As a script (``python bench/otelcost.py --mode MODE --count N``) it starts a broker,
posts ``N`` 100-byte messages through one ``holdfast.sdk.Session`` and prints one JSON
line: microseconds per ``post()`` and the end-to-end rate (post to last ACK). Modes:

- ``off``: ``SessionOptions(telemetry=False)``, the SDK as without the extra;
- ``api``: telemetry on, no tracer provider set (the API's default);
- ``sampled``: an SDK tracer provider with ``ParentBased(TraceIdRatioBased(0.01))``;
- ``recorded``: an SDK tracer provider recording every span into a batch processor
  whose exporter drops them (the export itself is not measured).

Global providers can be set once per process, hence one subprocess per mode
(``measure_all``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import harness  # noqa: F401  (puts the repository on sys.path, for tests.support)

MODES = ("off", "api", "sampled", "recorded")


def _install(mode: str) -> None:
    if mode in ("off", "api"):
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if mode == "sampled":
        trace.set_tracer_provider(TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01))))
    else:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=1 << 20))
        trace.set_tracer_provider(provider)


def measure(mode: str, count: int) -> dict[str, Any]:
    """Post ``count`` messages in ``mode``; per-post time and end-to-end rate."""
    _install(mode)
    from holdfast.sdk import Session, SessionOptions, tracing
    from tests.support.processes import BrokerProcess

    tracing.recheck()
    options = SessionOptions(telemetry=mode != "off")
    with (
        BrokerProcess(["--store", "memory"]) as broker,
        Session(broker.address, options=options) as s,
    ):
        queue = s.open_queue("hf://bench/otel", write=True)
        payload = b"x" * 100
        started = time.perf_counter()
        for _ in range(count):
            queue.post(payload)
        posted = time.perf_counter() - started
        if not s.flush(timeout=300):
            raise RuntimeError("the ACKs did not all arrive within 300 s")
        total = time.perf_counter() - started
    return {
        "mode": mode,
        "count": count,
        "post_us": posted / count * 1e6,
        "rate": count / total,
    }


def measure_all(count: int) -> list[dict[str, Any]]:
    """Every mode, each in a fresh interpreter."""
    rows = []
    for mode in MODES:
        done = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--count", str(count)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"otelcost {mode} failed: {done.stderr[-2000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--count", type=int, default=50_000)
    args = parser.parse_args()
    print(json.dumps(measure(args.mode, args.count)))


if __name__ == "__main__":
    main()

"""One OpenTelemetry SDK for the process (global providers can be set only once), with
an in-memory span exporter and metric reader; each test starts with no spans.

The tracer provider traces only while a test of this folder runs: the other tests of
the same pytest process then see the SDK as an application without a configured
provider sees it (no spans, no trace context in properties)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from holdfast.sdk import tracing


@dataclass
class Telemetry:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        """Finished spans whose name starts with ``prefix`` ("send ", "process "...)."""
        return [span for span in self.finished() if span.name.startswith(prefix)]


class _Switch:
    on = False


class _SwitchedTracer(trace.Tracer):
    """The SDK's tracer while a test of this folder runs, else the API's no-op one."""

    def __init__(self, real: trace.Tracer) -> None:
        self._real = real
        self._off = trace.NoOpTracer()

    def _now(self) -> trace.Tracer:
        return self._real if _Switch.on else self._off

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._now().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._now().start_as_current_span(*args, **kwargs)


class _SwitchedProvider(TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _SwitchedTracer(super().get_tracer(*args, **kwargs))


_installed: Telemetry | None = None


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    global _installed
    if _installed is None:
        exporter = InMemorySpanExporter()
        provider = _SwitchedProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _installed = Telemetry(exporter, reader)
        tracing.recheck()  # earlier tests of this process saw no provider
    _installed.spans.clear()
    _Switch.on = True
    try:
        yield _installed
    finally:
        _Switch.on = False
        _installed.spans.clear()

"""The OpenTelemetry spans of the Spark writer: ``stage`` (a task writing one
partition, on an executor) and ``commit`` / ``abort`` (the driver making a version
visible or discarding it). They record only where a tracer provider is configured
(the driver's process, or executors set up with ``opentelemetry-instrument``); the
messages a task stages are posted under explicit GUIDs, so they carry no trace
context of their own (``holdfast.sdk.tracing``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from holdfast.sdk import tracing


@contextlib.contextmanager
def spark_span(operation: str, uri: str, run: str, version: int) -> Iterator[None]:
    """A span around one step of a Spark write of ``version`` of run ``run`` to ``uri``."""
    attrs = tracing.attributes(tracing.SEND, operation, uri)
    attrs["holdfast.spark.run_id"] = run
    attrs["holdfast.spark.version"] = version
    kind = "PRODUCER" if operation == "stage" else "INTERNAL"
    span = tracing.start(f"{operation} {uri}", kind, attrs)
    try:
        with tracing.current(span):
            yield
    except BaseException as error:
        tracing.fail(span, error)
        raise
    tracing.end(span)


__all__ = ["spark_span"]

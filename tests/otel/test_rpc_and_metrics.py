"""Request/reply spans (call and serve), ``stats()`` as OpenTelemetry metrics, and the
SDK without OpenTelemetry installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from holdfast.sdk import AckStatus, Request, Session, Worker, WorkerOptions
from holdfast.sdk.testing import Broker
from tests.otel.conftest import Telemetry
from tests.otel.trace_support import attribute, is_child, trace_id

SERVICE = "hf://otel/service"
QUICK = WorkerOptions(heartbeat_interval=0.2, first_beat_after=0.05, caller_grace=1.0)

pytestmark = pytest.mark.timeout(60)


def test_a_call_and_its_serve_span_form_one_trace(telemetry: Telemetry) -> None:
    def handler(request: Request) -> bytes:
        if request.payload == b"fail":
            raise RuntimeError("no")
        return request.payload.upper()

    with (
        Broker() as broker,
        Session(broker.address, transport=broker.transport()) as worker_session,
        Session(broker.address, transport=broker.transport()) as caller,
        Worker(worker_session, SERVICE, handler, options=QUICK),
    ):
        assert caller.request(SERVICE, b"hello", timeout=10).payload == b"HELLO"
        with pytest.raises(Exception, match="no"):
            caller.request(SERVICE, b"fail", timeout=10)
    calls = telemetry.named("call ")
    serves = telemetry.named("serve ")
    assert len(calls) == len(serves) == 2
    ok_call = next(c for c in calls if c.status.status_code is not StatusCode.ERROR)
    failed_call = next(c for c in calls if c.status.status_code is StatusCode.ERROR)
    ok_serve = next(s for s in serves if is_child(s, ok_call))
    failed_serve = next(s for s in serves if is_child(s, failed_call))
    assert ok_call.kind is SpanKind.CLIENT and ok_serve.kind is SpanKind.SERVER
    assert attribute(ok_serve, "messaging.destination.name") == SERVICE
    assert failed_serve.status.status_code is StatusCode.ERROR
    # The request's send span is the call's child; heartbeats, cancels and replies are
    # the SDK's own messages: no trace of their own.
    assert any(is_child(s, ok_call) for s in telemetry.named(f"send {SERVICE}"))
    calls_traces = {trace_id(c) for c in calls}
    assert {trace_id(span) for span in telemetry.finished()} == calls_traces


def metric_points(telemetry: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
    data = telemetry.metrics.get_metrics_data()
    points: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    if data is None:
        return points  # nothing observed
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attrs = tuple(sorted((k, str(v)) for k, v in (point.attributes or {}).items()))
                    points[(metric.name, attrs)] = int(point.value)  # type: ignore[union-attr]
    return points


def test_session_stats_are_exported_as_metrics(telemetry: Telemetry) -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue("hf://otel/metrics", write=True)
        for i in range(7):
            queue.post(b"%d" % i)
        broker.fail_next_puts(1, AckStatus.STORE_ERROR)
        queue.post(b"refused")
        assert s.flush(timeout=10)
        points = metric_points(telemetry)
        me = ("holdfast.client.id", s.client_id)
    assert (
        points[("holdfast.client.acks", tuple(sorted([me, ("holdfast.ack.status", "SUCCESS")])))]
        == 7
    )
    assert (
        points[
            ("holdfast.client.acks", tuple(sorted([me, ("holdfast.ack.status", "STORE_ERROR")])))
        ]
        == 1
    )
    assert points[("holdfast.client.buffered_puts", (me,))] == 0
    assert points[("holdfast.client.reconnects", (me,))] == 0
    waits = (
        "holdfast.client.post_waits",
        tuple(sorted([me, ("holdfast.wait.reason", "high_watermark")])),
    )
    assert points[waits] == 0
    # A closed session reports no more.
    after = metric_points(telemetry)
    assert not any(me in attrs for _, attrs in after)


def test_the_sdk_works_unchanged_without_opentelemetry() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the [otel] extra were not installed
        from holdfast.sdk import Session, tracing
        from holdfast.sdk.testing import Broker
        assert not tracing.AVAILABLE
        with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
            queue = s.open_queue("hf://plain/q", write=True, read=True)
            queue.post(b"m")
            [message] = list(queue.messages(timeout=5))
            assert "traceparent" not in message.properties
            message.confirm()
            assert s.flush(timeout=10)
            print(s.stats().messages_confirmed)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"

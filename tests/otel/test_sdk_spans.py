"""The SDK's OpenTelemetry spans (send, process, settle) and the W3C trace context in
message properties, on the sync and asyncio SDK against the in-process test broker."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from holdfast.proto.limits import DEFAULT_MAX_PROPERTIES, DEFAULT_MAX_PROPERTIES_BYTES
from holdfast.sdk import Ack, AckStatus, Message, Session, SessionOptions, aio
from holdfast.sdk.testing import Broker
from tests.otel.conftest import Telemetry
from tests.otel.trace_support import attribute, is_child, names
from tests.support.waiting import wait_until

URI = "hf://otel/orders"

pytestmark = pytest.mark.timeout(60)


def test_post_to_ack_is_a_send_span_whose_context_the_message_carries(
    telemetry: Telemetry,
) -> None:
    got: list[Message] = []
    acks: list[Ack] = []
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True, on_ack=acks.append)
        guid = queue.post(b"order", properties={"k": "v"})
        assert s.flush(timeout=10)

        def consume(message: Message) -> None:
            got.append(message)
            message.confirm()

        s.open_queue(URI, read=True, on_message=consume)
        wait_until(lambda: len(telemetry.named("confirm ")) == 1, 10, "the settle span")
    [send] = telemetry.named("send ")
    [process] = telemetry.named("process ")
    [settle] = telemetry.named("confirm ")
    assert [a.guid for a in acks] == [guid]  # the application's on_ack still runs
    assert send.name == f"send {URI}"
    assert send.kind is SpanKind.PRODUCER
    assert attribute(send, "messaging.system") == "holdfast"
    assert attribute(send, "messaging.destination.name") == URI
    assert attribute(send, "messaging.operation.type") == "send"
    assert attribute(send, "messaging.message.id") == str(guid)
    assert attribute(send, "messaging.holdfast.ack_status") == "SUCCESS"
    # The message carries the send span's context, and its own properties as posted.
    [message] = got
    assert names(message.properties["traceparent"], send)
    assert message.properties["k"] == "v"
    assert process.kind is SpanKind.CONSUMER and is_child(process, send)
    assert attribute(process, "messaging.operation.type") == "process"
    assert attribute(process, "messaging.message.id") == str(guid)
    assert attribute(process, "messaging.holdfast.delivery_count") == 1
    assert settle.kind is SpanKind.CLIENT and is_child(settle, process)
    assert attribute(settle, "messaging.operation.type") == "settle"
    assert attribute(settle, "messaging.operation.name") == "confirm"


def test_a_post_inside_an_application_span_joins_its_trace(telemetry: Telemetry) -> None:
    tracer = trace.get_tracer("the application")
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True)
        with tracer.start_as_current_span("handle web request"):
            queue.post(b"order")
        assert s.flush(timeout=10)
    [outer] = telemetry.named("handle web request")
    [send] = telemetry.named("send ")
    assert is_child(send, outer)


def test_tracestate_travels_with_the_traceparent(telemetry: Telemetry) -> None:
    """What the SDK writes is what OpenTelemetry's W3C propagator writes."""
    incoming = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=opaque,other=1",
    }
    got: list[Message] = []
    tracer = trace.get_tracer("the application")
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True, read=True, on_message=got.append)
        with tracer.start_as_current_span(
            "handle", context=TraceContextTextMapPropagator().extract(incoming)
        ):
            queue.post(b"m")
        assert s.flush(timeout=10)
        wait_until(lambda: got, 10, "the delivery")
        got[0].confirm()
    [send] = telemetry.named("send ")
    expected: dict[str, str] = {}
    context = send.get_span_context()
    assert context is not None
    TraceContextTextMapPropagator().inject(
        expected, context=trace.set_span_in_context(trace.NonRecordingSpan(context))
    )
    assert {k: got[0].properties[k] for k in ("traceparent", "tracestate")} == expected
    assert expected["tracestate"] == "vendor=opaque,other=1"


def test_refused_and_unknown_outcomes_end_the_send_span_in_error(telemetry: Telemetry) -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True)
        broker.fail_next_puts(1, AckStatus.STORE_ERROR)
        queue.post(b"refused")
        assert s.flush(timeout=10)
    [send] = telemetry.named("send ")
    assert send.status.status_code is StatusCode.ERROR
    assert attribute(send, "messaging.holdfast.ack_status") == "STORE_ERROR"


def test_no_trace_context_is_written_where_it_must_not_be(telemetry: Telemetry) -> None:
    """An explicit GUID (a replay must be byte-identical), the application's own
    traceparent, and properties already at the broker's count limit are left alone."""
    got: list[Message] = []
    full = {f"p{i}": "v" for i in range(DEFAULT_MAX_PROPERTIES)}
    big = {"big": "x" * (DEFAULT_MAX_PROPERTIES_BYTES - len("big") - 10)}  # 10 bytes spare
    own = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        queue = s.open_queue(URI, write=True, read=True, on_message=got.append)
        queue.post(b"explicit", guid=uuid.uuid4())
        queue.post(b"own", properties=own)
        queue.post(b"full", properties=full)
        queue.post(b"big", properties=big)
        queue.post(b"plain")
        assert s.flush(timeout=10)
        wait_until(lambda: len(got) == 5, 10, "five deliveries")
        for message in got:
            message.confirm()
    by_payload = {m.payload: m.properties for m in got}
    assert "traceparent" not in by_payload[b"explicit"]
    assert by_payload[b"own"] == own
    assert by_payload[b"full"] == full
    assert by_payload[b"big"] == big
    assert "traceparent" in by_payload[b"plain"]
    assert len(telemetry.named("send ")) == 5  # every post still has its span


def test_a_failing_handler_records_the_error_and_the_automatic_reject(
    telemetry: Telemetry,
) -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        s.open_queue(URI, write=True).post(b"poison")

        def fail(message: Message) -> None:
            raise ValueError("cannot handle it")

        s.open_queue(URI, read=True, on_message=fail)
        wait_until(lambda: telemetry.named("reject "), 10, "the reject span")
    process = telemetry.named("process ")[0]
    reject = telemetry.named("reject ")[0]
    assert process.status.status_code is StatusCode.ERROR
    assert [e.name for e in process.events] == ["exception"]
    assert is_child(reject, process)


def test_iterator_items_get_a_process_span_each(telemetry: Telemetry) -> None:
    with Broker() as broker, Session(broker.address, transport=broker.transport()) as s:
        producer = s.open_queue(URI, write=True)
        for i in range(3):
            producer.post(b"%d" % i)
        assert s.flush(timeout=10)
        reader = s.open_queue(URI, read=True)
        for message in reader.messages(timeout=0.5):
            assert len(telemetry.named("process ")) == int(message.payload)  # ended lazily
            message.confirm()
    sends = telemetry.named("send ")
    processes = telemetry.named("process ")
    assert len(processes) == 3
    assert all(any(is_child(p, send) for send in sends) for p in processes)
    assert all(any(is_child(c, p) for p in processes) for c in telemetry.named("confirm "))


def test_the_asyncio_sdk_traces_the_same_way(telemetry: Telemetry) -> None:
    async def main() -> None:
        with Broker() as broker:
            async with aio.Session(broker.address, transport=broker.async_transport()) as s:
                queue = await s.open_queue(URI, write=True, read=True)
                await queue.post(b"a")
                assert await s.flush(timeout=10)
                async for message in queue:
                    message.confirm()
                    break

    asyncio.run(main())
    [send] = telemetry.named("send ")
    [process] = telemetry.named("process ")
    [settle] = telemetry.named("confirm ")
    assert is_child(process, send) and is_child(settle, process)


def test_telemetry_false_keeps_a_session_out_of_opentelemetry(telemetry: Telemetry) -> None:
    got: list[Message] = []
    ready = threading.Event()

    def consume(message: Message) -> None:
        got.append(message)
        message.confirm()
        ready.set()

    options = SessionOptions(telemetry=False)
    with (
        Broker() as broker,
        Session(broker.address, transport=broker.transport(), options=options) as s,
    ):
        s.open_queue(URI, write=True).post(b"quiet")
        s.open_queue(URI, read=True, on_message=consume)
        assert ready.wait(10)
    assert telemetry.finished() == []
    assert "traceparent" not in got[0].properties

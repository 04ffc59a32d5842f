"""One trace from ``post()`` through a real proxy and a real broker (both serving gRPC
on 127.0.0.1, on an event loop thread of this process, so their spans reach the same
in-memory exporter) to the consumer's handler:
send → relay → accept → deliver → process → confirm."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from holdfast.broker.config import BrokerConfig
from holdfast.broker.server import Broker
from holdfast.proxy.config import ProxyConfig
from holdfast.proxy.server import Proxy
from holdfast.sdk import AckStatus, Message, ReconnectOptions, Session, SessionOptions
from tests.otel.conftest import Telemetry
from tests.otel.trace_support import attribute, is_child, names, trace_id
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until

URI = "hf://otel/e2e"
FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.05))

pytestmark = pytest.mark.timeout(60)


class Servers:
    """A broker and a proxy in front of it, on a loop thread of this process."""

    def __init__(self, store: str = "memory") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        config = BrokerConfig(listen="127.0.0.1:0", shutdown_grace=1.0, store=store)

        async def make_broker() -> Broker:
            return Broker(config)

        self.broker: Broker = self._run(make_broker())
        self.broker_address: str = self._run(self.broker.start())
        proxy_config = ProxyConfig(
            listen="127.0.0.1:0", upstream=self.broker_address, upstream_options=FAST
        )

        async def make() -> Proxy:
            return Proxy(proxy_config)

        self.proxy: Proxy = self._run(make())
        self.address: str = self._run(self.proxy.start())

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    def stop(self) -> None:
        self._run(self.proxy.stop(grace=1.0))
        self._run(self.broker.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(params=["memory", "redis"])
def servers(
    request: pytest.FixtureRequest, telemetry: Telemetry, tmp_path: Path
) -> Iterator[Servers]:
    """The proxy and a broker on the memory store, or on a Redis it starts."""
    with contextlib.ExitStack() as stack:
        store = "memory"
        if request.param == "redis":
            store = stack.enter_context(RedisServer(tmp_path / "redis")).url
        running = Servers(store)
        try:
            yield running
        finally:
            running.stop()


def test_one_trace_links_post_relay_accept_deliver_process_and_confirm(
    telemetry: Telemetry, servers: Servers
) -> None:
    got: list[Message] = []

    def consume(message: Message) -> None:
        got.append(message)
        message.confirm()

    with Session(servers.address, options=FAST) as session:
        queue = session.open_queue(URI, write=True)
        guid = queue.post(b"traced", properties={"order": "7"})
        assert session.flush(timeout=10)
        session.open_queue(URI, read=True, on_message=consume)
        wait_until(lambda: telemetry.named("confirm "), 10, "the confirm span")
    [send] = telemetry.named(f"send {URI}")
    [relay] = telemetry.named(f"relay {URI}")
    [accept] = telemetry.named(f"accept {URI}")
    [deliver] = telemetry.named(f"deliver {URI}")
    [process] = telemetry.named(f"process {URI}")
    [confirm] = telemetry.named(f"confirm {URI}")
    spans = [send, relay, accept, deliver, process, confirm]
    assert len({trace_id(span) for span in spans}) == 1  # one trace
    # Every hop parents its span on the context the message carries: the send span.
    for hop in (relay, accept, deliver, process):
        assert is_child(hop, send), hop.name
    assert is_child(confirm, process)
    assert [span.kind for span in spans] == [
        SpanKind.PRODUCER,
        SpanKind.PRODUCER,
        SpanKind.CONSUMER,
        SpanKind.PRODUCER,
        SpanKind.CONSUMER,
        SpanKind.CLIENT,
    ]
    for span in spans:
        assert attribute(span, "messaging.system") == "holdfast"
        assert attribute(span, "messaging.destination.name") == URI
        assert attribute(span, "messaging.message.id") == str(guid)
        assert span.status.status_code is not StatusCode.ERROR
    assert [attribute(s, "messaging.operation.type") for s in spans] == [
        "send",
        "send",
        "receive",
        "send",
        "process",
        "settle",
    ]
    assert attribute(accept, "messaging.holdfast.ack_status") == "OK"
    assert attribute(deliver, "messaging.holdfast.delivery_count") == 1
    # The order of the hops in time (each one starts after the one before it).
    assert send.start_time <= relay.start_time <= accept.start_time  # type: ignore[operator]
    assert accept.end_time <= deliver.end_time <= process.start_time  # type: ignore[operator]
    # The broker and the proxy passed the trace context on untouched.
    [message] = got
    assert names(message.properties["traceparent"], send)
    assert dict(message.properties) == {
        "order": "7",
        "traceparent": message.properties["traceparent"],
    }


def test_untraced_messages_get_no_server_spans(telemetry: Telemetry, servers: Servers) -> None:
    got: list[Message] = []
    options = SessionOptions(reconnect=FAST.reconnect, telemetry=False)
    with Session(servers.address, options=options) as session:
        queue = session.open_queue(URI, write=True, read=True, on_message=got.append)
        queue.post(b"plain")
        assert session.flush(timeout=10)
        wait_until(lambda: got, 10, "the delivery")
        got[0].confirm()
    assert telemetry.finished() == []


def test_a_conflict_ends_the_relay_and_accept_spans_in_error(
    telemetry: Telemetry, servers: Servers
) -> None:
    """The broker's verdict reaches the server spans: the same GUID posted again with
    other content (the application's own trace context, kept as given) is a CONFLICT."""
    carrier: dict[str, str] = {}
    with trace.get_tracer("the application").start_as_current_span("import job"):
        TraceContextTextMapPropagator().inject(carrier)
    guid = uuid.uuid4()
    with Session(servers.address, options=FAST) as session:
        queue = session.open_queue(URI, write=True)
        queue.post(b"first", properties=carrier, guid=guid)
        assert session.flush(timeout=10)
        statuses: list[AckStatus] = []
        queue.post(
            b"other", properties=carrier, guid=guid, on_ack=lambda a: statuses.append(a.status)
        )
        assert session.flush(timeout=10)
    assert statuses == [AckStatus.CONFLICT]
    [app] = telemetry.named("import job")
    accepts = telemetry.named(f"accept {URI}")
    relays = telemetry.named(f"relay {URI}")
    assert len(accepts) == len(relays) == 2
    assert all(is_child(span, app) for span in [*accepts, *relays])
    assert [a.status.status_code for a in accepts] == [StatusCode.UNSET, StatusCode.ERROR]
    assert attribute(accepts[1], "messaging.holdfast.ack_status") == "CONFLICT"
    assert relays[1].status.status_code is StatusCode.ERROR

"""The proxy's routing, in one process: applications -> the proxy (served on a free
127.0.0.1 port on a loop thread of the test) -> ``holdfast.sdk.testing.Broker`` over
the in-memory transport. No broker process: ACKs, PUSHes and CONFIRMs are routed by
the proxy's own code, and the testing broker's hooks make the faults."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from holdfast.proxy.config import ProxyConfig
from holdfast.proxy.server import Proxy
from holdfast.sdk import Ack, Message, QueueOptions, Session
from holdfast.sdk.events import ConfirmRejected, SessionEvent
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from holdfast.sdk.testing import Broker
from tests.support.waiting import wait_until

FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.05))

pytestmark = pytest.mark.timeout(60)


class InProcessProxy:
    """A ``Proxy`` on an event loop thread of this process, upstream on ``broker``."""

    def __init__(self, broker: Broker) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        config = ProxyConfig(
            listen="127.0.0.1:0",
            upstream=broker.address,
            upstream_options=SessionOptions(
                client_name="holdfast-proxy",
                reconnect=ReconnectOptions(initial=0.01, maximum=0.05),
            ),
        )

        async def make() -> Proxy:
            return Proxy(config, upstream_transport=broker.async_transport())

        self.proxy: Proxy = self._run(make())
        self.address: str = self._run(self.proxy.start())

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    def stop(self) -> None:
        self._run(self.proxy.stop(grace=1.0))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def chain() -> Iterator[tuple[Broker, InProcessProxy]]:
    with Broker() as broker:
        proxy = InProcessProxy(broker)
        try:
            yield broker, proxy
        finally:
            proxy.stop()


def unique_uri() -> str:
    return f"hf://routing/q-{uuid.uuid4().hex[:8]}"


def test_each_client_gets_the_acks_of_its_own_puts_once(
    chain: tuple[Broker, InProcessProxy],
) -> None:
    broker, proxy = chain
    uri = unique_uri()
    acks: dict[str, list[Ack]] = {"a": [], "b": []}
    posted: dict[str, list[uuid.UUID]] = {"a": [], "b": []}
    with Session(proxy.address) as a, Session(proxy.address) as b:
        queues = {
            "a": a.open_queue(uri, write=True, on_ack=acks["a"].append),
            "b": b.open_queue(uri, write=True, on_ack=acks["b"].append),
        }
        for i in range(300):
            for name, queue in queues.items():
                posted[name].append(queue.post(b"%s-%d" % (name.encode(), i)))
        assert a.flush(timeout=20) and b.flush(timeout=20)
    for name in ("a", "b"):
        assert Counter(ack.guid for ack in acks[name]) == Counter({g: 1 for g in posted[name]})
    assert broker.depth(uri) == 600


def test_each_push_goes_to_the_client_whose_handle_it_was_delivered_to(
    chain: tuple[Broker, InProcessProxy],
) -> None:
    broker, proxy = chain
    uri = unique_uri()
    got: dict[str, list[Message]] = {"a": [], "b": []}

    def consumer(name: str) -> Any:
        def on_message(message: Message) -> None:
            got[name].append(message)
            message.confirm()

        return on_message

    with (
        Session(proxy.address) as producer,
        Session(proxy.address) as a,
        Session(proxy.address) as b,
    ):
        a.open_queue(uri, read=True, on_message=consumer("a"), options=QueueOptions(10))
        b.open_queue(uri, read=True, on_message=consumer("b"), options=QueueOptions(10))
        queue = producer.open_queue(uri, write=True)
        sent = {queue.post(b"m%d" % i) for i in range(200)}
        assert producer.flush(timeout=20)
        wait_until(lambda: len(got["a"]) + len(got["b"]) == 200, 20, "200 deliveries")
    received = [m.guid for name in ("a", "b") for m in got[name]]
    assert Counter(received) == Counter({g: 1 for g in sent})
    assert got["a"] and got["b"]  # round-robin reached both clients through the proxy
    assert broker.depth(uri) == 0


def test_a_relayed_push_keeps_its_payload_properties_guid_and_delivery_count(
    chain: tuple[Broker, InProcessProxy],
) -> None:
    """The proxy hands the broker's Push to its client as it came, rewriting only the
    handle id: nothing else may change on the way, on a first delivery or a later one."""
    broker, proxy = chain
    uri = unique_uri()
    held: list[Message] = []
    with Session(proxy.address, options=FAST) as other, Session(proxy.address) as client:
        producer = other.open_queue(uri, write=True)
        guid = producer.post(b"payload", properties={"k": "v", "trace": "t-1"})
        assert other.flush(timeout=10)
        # Another client's handle came first upstream, so this client's handle id is
        # not the upstream one: a Push passed on unchanged would name the wrong handle.
        client.open_queue(uri, read=True, on_message=held.append, options=QueueOptions(1))
        wait_until(lambda: len(held) == 1, 10, "the first delivery")
        held[0].reject(requeue=True)
        wait_until(lambda: len(held) == 2, 10, "the redelivery")
        for count, message in enumerate(held, start=1):
            assert (message.guid, message.payload, message.delivery_count) == (
                guid,
                b"payload",
                count,
            )
            assert dict(message.properties) == {"k": "v", "trace": "t-1"}
            assert message.queue_uri == uri
        held[1].confirm()
        wait_until(lambda: broker.depth(uri) == 0, 10, "the message settled")


def test_after_an_upstream_drop_one_confirm_settles_the_message_and_a_second_is_stale(
    chain: tuple[Broker, InProcessProxy],
) -> None:
    """The client holds the stale delivery and the redelivery of one message: a CONFIRM
    names only a GUID, so the first settles the redelivery at the broker (the client
    processed the message either way) and the second is refused as stale."""
    broker, proxy = chain
    uri = unique_uri()
    held: list[Message] = []
    events: list[SessionEvent] = []
    with Session(proxy.address, on_event=events.append, options=FAST) as client:
        client.open_queue(uri, read=True, on_message=held.append, options=QueueOptions(1))
        producer = client.open_queue(uri, write=True)
        producer.post(b"once")
        assert client.flush(timeout=10)
        wait_until(lambda: len(held) == 1, 10, "the first delivery")
        broker.drop_connections()  # the proxy's upstream link: clients stay connected
        wait_until(lambda: len(held) == 2, 20, "the redelivery after the upstream drop")
        stale, fresh = held
        assert (stale.guid, stale.delivery_count, fresh.delivery_count) == (fresh.guid, 1, 2)
        assert broker.unconfirmed(uri) == 1
        stale.confirm()
        wait_until(lambda: broker.unconfirmed(uri) == 0, 10, "the message settled")
        assert broker.depth(uri) == 0
        fresh.confirm()
        wait_until(
            lambda: any(isinstance(e, ConfirmRejected) for e in events), 10, "the stale refusal"
        )
        assert len(held) == 2  # settled: never delivered again
    assert not any(type(e).__name__ == "ConnectionLost" for e in events)

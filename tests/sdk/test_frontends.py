"""The contract, run against both front-ends: ``holdfast.sdk.Session`` (threads) and
``holdfast.sdk.aio.Session`` (asyncio), on a real broker process and on the in-process
``holdfast.sdk.testing.Broker``.

Each scenario is written once, against a small adapter; the adapter calls the
front-end's own API (the threaded one from a worker thread, as an application's
thread would, the asyncio one on the loop), so neither is a thinner copy.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest

from holdfast.sdk import Ack, AckStatus, ConfirmDroppedError, Message, QueueOptions, Session
from holdfast.sdk import aio as hf_aio
from holdfast.sdk.events import (
    ConnectionLost,
    QueueReopened,
    Reconnected,
    SessionEvent,
    StateRestored,
)
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from holdfast.sdk.testing import Broker
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_until_async

FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.05))

pytestmark = pytest.mark.timeout(60)


class Front(Protocol):
    """What a scenario needs of a session, whichever front-end is behind it."""

    events: list[SessionEvent]

    async def open(self, uri: str, **kwargs: Any) -> Any: ...
    async def post(self, queue: Any, payload: bytes, on_ack: Callable[[Ack], Any]) -> uuid.UUID: ...
    async def flush(self, timeout: float) -> bool: ...
    async def close_queue(self, queue: Any) -> None: ...
    async def close(self) -> None: ...


class SyncFront:
    """The threaded API, called from a worker thread as an application thread would."""

    def __init__(self, address: str, transport: Any) -> None:
        self.events: list[SessionEvent] = []
        self.session = Session(
            address, transport=transport, on_event=self.events.append, options=FAST
        )

    async def open(self, uri: str, **kwargs: Any) -> Any:
        return await asyncio.to_thread(lambda: self.session.open_queue(uri, **kwargs))

    async def post(self, queue: Any, payload: bytes, on_ack: Callable[[Ack], Any]) -> uuid.UUID:
        guid: uuid.UUID = await asyncio.to_thread(queue.post, payload, None, on_ack)
        return guid

    async def flush(self, timeout: float) -> bool:
        return await asyncio.to_thread(self.session.flush, timeout)

    async def close_queue(self, queue: Any) -> None:
        await asyncio.to_thread(queue.close)

    async def close(self) -> None:
        await asyncio.to_thread(self.session.close)


class AsyncFront:
    """The asyncio API, on the loop."""

    def __init__(self, address: str, transport: Any) -> None:
        self.events: list[SessionEvent] = []
        self.session = hf_aio.Session(
            address, transport=transport, on_event=self.events.append, options=FAST
        )

    async def open(self, uri: str, **kwargs: Any) -> Any:
        return await self.session.open_queue(uri, **kwargs)

    async def post(self, queue: Any, payload: bytes, on_ack: Callable[[Ack], Any]) -> uuid.UUID:
        guid: uuid.UUID = await queue.post(payload, on_ack=on_ack)
        return guid

    async def flush(self, timeout: float) -> bool:
        return await self.session.flush(timeout)

    async def close_queue(self, queue: Any) -> None:
        await queue.close()

    async def close(self) -> None:
        await self.session.close()


FRONTS: dict[str, Callable[[str, Any], Front]] = {"threads": SyncFront, "asyncio": AsyncFront}


@pytest.fixture(scope="module")
def broker_process() -> Iterator[BrokerProcess]:
    with BrokerProcess().start() as process:
        yield process


@pytest.fixture
def memory_broker() -> Iterator[Broker]:
    with Broker() as broker:
        yield broker


@pytest.fixture(params=["threads", "asyncio"])
def front_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def make_front(kind: str, broker: Broker | BrokerProcess) -> Front:
    if isinstance(broker, Broker):
        transport = broker.transport() if kind == "threads" else broker.async_transport()
        return FRONTS[kind](broker.address, transport)
    return FRONTS[kind](broker.address, None)


def run(scenario: Callable[[Front], Any], front: Front) -> None:
    async def main() -> None:
        try:
            await scenario(front)
        finally:
            await front.close()

    asyncio.run(main())


def unique_uri(name: str) -> str:
    return f"hf://frontends/{name}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------- scenarios


async def posts_are_uuid7_and_acked_once(front: Front) -> None:
    acks: list[Ack] = []
    queue = await front.open(unique_uri("acks"), write=True)
    guids = [await front.post(queue, b"m%d" % i, acks.append) for i in range(200)]
    assert await front.flush(10)
    assert all(guid.version == 7 for guid in guids)
    assert Counter(a.guid for a in acks) == Counter({g: 1 for g in guids})
    assert {a.status for a in acks} == {AckStatus.SUCCESS}


async def a_consumer_receives_each_message_and_confirms_it(front: Front) -> None:
    uri = unique_uri("consume")
    got: list[Message] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_message(message: Message) -> None:
        got.append(message)
        message.confirm()
        if len(got) == 50:
            loop.call_soon_threadsafe(done.set)

    writer = await front.open(uri, write=True)
    for i in range(50):
        await front.post(writer, b"c%d" % i, lambda ack: None)
    await front.open(uri, read=True, on_message=on_message, options=QueueOptions(10))
    await asyncio.wait_for(done.wait(), 10)
    assert sorted(m.payload for m in got) == sorted(b"c%d" % i for i in range(50))
    assert {m.delivery_count for m in got} == {1}


@pytest.mark.parametrize(
    "scenario", [posts_are_uuid7_and_acked_once, a_consumer_receives_each_message_and_confirms_it]
)
def test_contract_on_a_broker_process(
    scenario: Callable[[Front], Any], front_kind: str, broker_process: BrokerProcess
) -> None:
    run(scenario, make_front(front_kind, broker_process))


@pytest.mark.parametrize(
    "scenario", [posts_are_uuid7_and_acked_once, a_consumer_receives_each_message_and_confirms_it]
)
def test_contract_on_the_testing_broker(
    scenario: Callable[[Front], Any], front_kind: str, memory_broker: Broker
) -> None:
    run(scenario, make_front(front_kind, memory_broker))


def test_a_dropped_link_loses_and_duplicates_nothing_and_events_come_in_order(
    front_kind: str, memory_broker: Broker
) -> None:
    uri = unique_uri("drop")

    async def scenario(front: Front) -> None:
        acks: list[Ack] = []
        queue = await front.open(uri, write=True)
        guids = [await front.post(queue, b"b%d" % i, acks.append) for i in range(100)]
        assert memory_broker.drop_connections() == 1
        guids += [await front.post(queue, b"a%d" % i, acks.append) for i in range(100)]
        assert await front.flush(10)
        assert Counter(a.guid for a in acks) == Counter({g: 1 for g in guids})
        assert memory_broker.depth(uri) == 200  # replays recognised by GUID
        kinds = [type(e) for e in front.events]
        lost = kinds.index(ConnectionLost)
        assert kinds[lost:] == [ConnectionLost, Reconnected, QueueReopened, StateRestored]

    run(scenario, make_front(front_kind, memory_broker))


def test_refused_puts_are_reported_with_their_status_once(
    front_kind: str, memory_broker: Broker
) -> None:
    async def scenario(front: Front) -> None:
        acks: list[Ack] = []
        queue = await front.open(unique_uri("refused"), write=True)
        memory_broker.fail_next_puts(3, AckStatus.STORE_ERROR)
        guids = [await front.post(queue, b"r%d" % i, acks.append) for i in range(5)]
        assert await front.flush(10)
        statuses = {a.guid: a.status for a in acks}
        assert [statuses[g] for g in guids] == [AckStatus.STORE_ERROR] * 3 + [AckStatus.SUCCESS] * 2

    run(scenario, make_front(front_kind, memory_broker))


def test_a_confirm_of_a_delivery_from_an_earlier_connection_is_dropped(
    front_kind: str, memory_broker: Broker
) -> None:
    """Rule 5 on both front-ends: the CONFIRM raises ``ConfirmDroppedError`` and the
    message comes back once more, counted."""
    uri = unique_uri("stale-confirm")

    async def scenario(front: Front) -> None:
        got: list[Message] = []
        writer = await front.open(uri, write=True)
        await front.post(writer, b"once", lambda ack: None)
        assert await front.flush(10)
        await front.open(uri, read=True, on_message=got.append)
        await wait_until_async(lambda: len(got) == 1, 10, "the delivery")
        assert memory_broker.drop_connections() == 1
        await wait_until_async(lambda: len(got) == 2, 10, "the redelivery")
        with pytest.raises(ConfirmDroppedError):
            got[0].confirm()
        got[1].confirm()
        assert [m.delivery_count for m in got] == [1, 2]
        assert got[0].guid == got[1].guid
        await wait_until_async(
            lambda: memory_broker.unconfirmed(uri) == 0, 10, "the broker's count"
        )
        assert memory_broker.depth(uri) == 0

    run(scenario, make_front(front_kind, memory_broker))


def test_closing_a_queue_while_disconnected_is_local_and_reports_unknown_once(
    front_kind: str, memory_broker: Broker
) -> None:
    """Rule 6 on both front-ends: with no broker to reach, the close succeeds at once
    and the queue's buffered PUT is reported ``UNKNOWN``, once."""

    async def scenario(front: Front) -> None:
        acks: list[Ack] = []
        queue = await front.open(unique_uri("close-offline"), write=True)
        memory_broker.network.stop_listening(memory_broker.address)
        assert memory_broker.drop_connections() == 1
        await wait_until_async(
            lambda: ConnectionLost in map(type, front.events), 10, "ConnectionLost"
        )
        guid = await front.post(queue, b"buffered", acks.append)  # rule 2: taken
        await asyncio.wait_for(front.close_queue(queue), 5)
        await wait_until_async(lambda: acks, 10, "the report")
        assert [(a.guid, a.status) for a in acks] == [(guid, AckStatus.UNKNOWN)]

    run(scenario, make_front(front_kind, memory_broker))


def test_aio_async_for_yields_messages_until_the_queue_closes(memory_broker: Broker) -> None:
    async def main() -> None:
        uri = unique_uri("iterate")
        async with hf_aio.Session(
            memory_broker.address, transport=memory_broker.async_transport()
        ) as session:
            writer = await session.open_queue(uri, write=True)
            for i in range(20):
                await writer.post(b"i%d" % i)
            reader = await session.open_queue(uri, read=True, options=QueueOptions(5))
            seen = []
            async for message in reader:
                seen.append(message.payload)
                message.confirm()
                if len(seen) == 20:
                    await reader.close()
            assert seen == [b"i%d" % i for i in range(20)]
            assert memory_broker.depth(uri) == 0

    asyncio.run(main())

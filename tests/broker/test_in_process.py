"""A broker in this process, through real gRPC, with a store the test controls: slow
or failing writes, recovered state, the read bound, failures inside a session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc
import pytest

from holdfast.broker import Broker, BrokerConfig, MemoryStore, RecoveredState, StoreBatch, puts
from holdfast.broker.accept import accept
from holdfast.broker.dedup import content_digest
from holdfast.broker.store import COMPLETED, HistoryEntry, StoredMessage
from holdfast.proto import PROTOCOL_VERSION, SESSION_METHOD, pb
from holdfast.proto.columns import put_batch
from tests.broker.util import new_guid, unique_uri
from tests.support.columns import AckView, acks_of, pushes_of

TIMEOUT = 10.0
QUIET = 0.2


class GatedStore(MemoryStore):
    """A store whose writes of new messages for ``held`` URIs wait for ``release()``."""

    def __init__(self, recovered: RecoveredState | None = None) -> None:
        self.batches: list[StoreBatch] = []
        self.held: set[str] = set()
        self.pending: list[asyncio.Future[None]] = []
        self.closed = False
        self._recovered = recovered or RecoveredState()

    def recover(self) -> RecoveredState:
        return self._recovered

    def write(self, batch: StoreBatch) -> Awaitable[None]:
        self.batches.append(batch)
        if not any(m.queue_uri in self.held for m in batch.messages):
            return COMPLETED
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future

    def release(self, error: Exception | None = None) -> None:
        """Complete (or fail) every held write; later writes are not held."""
        self.held.clear()
        pending, self.pending = self.pending, []
        for future in pending:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def stored_guids(self) -> list[bytes]:
        return [m.guid for batch in self.batches for m in batch.messages]

    def close(self) -> None:
        self.closed = True


def _identity(data: bytes) -> bytes:
    return data


class AioClient:
    """A bare session stream on the test's event loop; a task receives its frames."""

    def __init__(self, address: str, receive: bool = True) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        method = self.channel.stream_stream(
            SESSION_METHOD,
            request_serializer=_identity,
            response_deserializer=pb.ServerFrame.FromString,
        )
        self.call = method()
        self.next_id = 1
        self.frames: asyncio.Queue[pb.ServerFrame | BaseException | None] = asyncio.Queue()
        self.receiver: asyncio.Task[None] | None = None
        if receive:
            self.start_receiving()

    def start_receiving(self) -> None:
        """Start reading the stream (a client made with ``receive=False`` does not)."""
        self.receiver = asyncio.get_running_loop().create_task(self._receive())

    async def _receive(self) -> None:
        try:
            while (frame := await self.call.read()) is not grpc.aio.EOF:
                await self.frames.put(frame)
            await self.frames.put(None)
        except BaseException as error:  # the end of the stream, as the test will see it
            await self.frames.put(error)

    @classmethod
    async def connect(cls, address: str) -> AioClient:
        client = cls(address)
        await client.send(pb.ClientFrame(hello=pb.Hello(protocol_version=PROTOCOL_VERSION)))
        assert (await client.recv()).WhichOneof("frame") == "hello_reply"
        return client

    async def send(self, frame: pb.ClientFrame) -> None:
        await self.call.write(frame.SerializeToString())

    async def recv(self, timeout: float = TIMEOUT) -> pb.ServerFrame:
        """The next frame; raises what ended the stream, or AssertionError at a clean end."""
        item = await asyncio.wait_for(self.frames.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        assert item is not None, "the stream ended"
        return item

    async def ended(self, timeout: float = TIMEOUT) -> None:
        """Wait for the server to end the stream cleanly."""
        item = await asyncio.wait_for(self.frames.get(), timeout)
        assert item is None, f"expected the end of the stream, got {item!r}"

    async def nothing_within(self, seconds: float = QUIET) -> bool:
        """True if no frame arrives within ``seconds``; fails the test otherwise."""
        try:
            item = await asyncio.wait_for(self.frames.get(), seconds)
        except TimeoutError:
            return True
        raise AssertionError(f"unexpected frame: {item}")

    async def open(self, queue_id: int, uri: str, read: bool = False, write: bool = False) -> None:
        request = pb.OpenQueue(
            request_id=self.request_id(), queue_id=queue_id, uri=uri, read=read, write=write
        )
        await self.send(pb.ClientFrame(open_queue=request))
        frame = await self.recv()
        assert frame.response.status == pb.STATUS_OK, frame

    def request_id(self) -> int:
        self.next_id += 1
        return self.next_id

    async def put(self, queue_id: int, guids: list[bytes], payload: bytes = b"p") -> None:
        batch = put_batch([queue_id], guids, [payload] * len(guids))
        await self.send(pb.ClientFrame(puts=batch))

    async def acks(self, count: int) -> list[AckView]:
        acks: list[AckView] = []
        while len(acks) < count:
            frame = await self.recv()
            assert frame.WhichOneof("frame") == "acks", frame
            acks.extend(acks_of(frame.acks))
        return acks

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()
        if self.receiver is not None:
            await asyncio.wait([self.receiver])


def run_with_broker(
    scenario: Callable[[Broker, GatedStore], Coroutine[Any, Any, None]],
    store: GatedStore | None = None,
    **config: Any,
) -> None:
    """Run ``scenario`` against an in-process broker on a free port, then stop it."""

    async def main() -> None:
        gated = store or GatedStore()
        broker = Broker(BrokerConfig(listen="127.0.0.1:0", shutdown_grace=1.0, **config), gated)
        await broker.start()
        try:
            await asyncio.wait_for(scenario(broker, gated), 60)
        finally:
            await broker.stop()
        assert gated.closed

    asyncio.run(main())


def ready_guids(broker: Broker, uri: str) -> list[bytes]:
    queue = broker.queues.get(uri)
    return [] if queue is None else [m.guid for m in queue.ready]


def test_a_replay_waits_for_its_original_to_be_stored() -> None:
    uri = unique_uri("in-flight")
    guid = new_guid()

    async def scenario(broker: Broker, store: GatedStore) -> None:
        store.held.add(uri)
        first = await AioClient.connect(broker.address)
        retry = await AioClient.connect(broker.address)  # a client retransmitting elsewhere
        await first.open(1, uri, write=True)
        await retry.open(1, uri, write=True)
        await first.put(1, [guid])
        await wait_for(lambda: len(store.pending) == 1)
        await retry.put(1, [guid, guid])
        assert await retry.nothing_within()
        assert await first.nothing_within(0.01)
        assert ready_guids(broker, uri) == []  # not enqueued before it is durable
        store.release()
        assert [a.status for a in await first.acks(1)] == [pb.STATUS_OK]
        assert [a.status for a in await retry.acks(2)] == [pb.STATUS_OK] * 2
        assert ready_guids(broker, uri) == [guid]
        assert store.stored_guids() == [guid]
        # Once stored, the GUID is in the history: another replay is ACKed at once.
        await retry.put(1, [guid])
        assert [a.status for a in await retry.acks(1)] == [pb.STATUS_OK]
        assert ready_guids(broker, uri) == [guid]
        await first.close()
        await retry.close()

    run_with_broker(scenario)


def test_a_failed_write_fails_the_original_and_its_replays() -> None:
    uri = unique_uri("store-error")
    guid, other = new_guid(), new_guid()

    async def scenario(broker: Broker, store: GatedStore) -> None:
        store.held.add(uri)
        first = await AioClient.connect(broker.address)
        retry = await AioClient.connect(broker.address)
        await first.open(1, uri, write=True)
        await retry.open(1, uri, write=True)
        await first.put(1, [guid, other, guid])
        await wait_for(lambda: len(store.pending) == 1)
        await retry.put(1, [guid])
        await asyncio.sleep(0)  # let the broker read it before the write fails
        await wait_for(lambda: broker.puts.in_progress == 2)
        store.release(OSError("disk full"))
        acks = await first.acks(3)
        assert [(a.guid, a.status) for a in acks] == [
            (guid, pb.STATUS_STORE_ERROR),
            (other, pb.STATUS_STORE_ERROR),
            (guid, pb.STATUS_STORE_ERROR),
        ]
        assert [a.status for a in await retry.acks(1)] == [pb.STATUS_STORE_ERROR]
        assert ready_guids(broker, uri) == []
        # Nothing was recorded: the client's retransmission is a new attempt.
        await retry.put(1, [guid])
        assert [a.status for a in await retry.acks(1)] == [pb.STATUS_OK]
        assert ready_guids(broker, uri) == [guid]
        await first.close()
        await retry.close()

    run_with_broker(scenario)


def test_a_store_that_raises_in_write_is_a_failed_write() -> None:
    uri = unique_uri("raising-store")

    class RaisingStore(GatedStore):
        def write(self, batch: StoreBatch) -> Awaitable[None]:
            if batch.messages:
                raise OSError("read-only file system")
            return COMPLETED

    async def scenario(broker: Broker, store: GatedStore) -> None:
        client = await AioClient.connect(broker.address)
        await client.open(1, uri, write=True)
        guid = new_guid()
        await client.put(1, [guid])
        assert [a.status for a in await client.acks(1)] == [pb.STATUS_STORE_ERROR]
        await client.put(1, [guid])  # not stuck "in flight"
        assert [a.status for a in await client.acks(1)] == [pb.STATUS_STORE_ERROR]
        await client.close()

    run_with_broker(scenario, RaisingStore())


@pytest.mark.parametrize("write", ["completed at once", "completed later"])
def test_a_failure_enqueueing_a_durable_frame_fails_its_puts_and_frees_them(
    write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a frame's write is durable its messages join their queues, where the store
    finished it at once (the memory store: no task) or later (a store writing on a
    thread or a socket: in the frame's task). A failure there ACKs its PUTs
    STORE_ERROR, leaves nothing in flight, gives the history's reservation back once,
    and the session goes on: the retransmission is stored."""
    uri = unique_uri("accept-fails")
    guid = new_guid()
    failures = [OSError("accept failed")]

    def accept_once(*args: Any) -> None:
        if failures:
            raise failures.pop()
        accept(*args)

    monkeypatch.setattr(puts, "accept", accept_once)

    async def scenario(broker: Broker, store: GatedStore) -> None:
        if write == "completed later":
            store.held.add(uri)
        client = await AioClient.connect(broker.address)
        await client.open(1, uri, write=True)
        await client.put(1, [guid])
        if write == "completed later":
            await wait_for(lambda: len(store.pending) == 1)
            store.release()
        assert [a.status for a in await client.acks(1)] == [pb.STATUS_STORE_ERROR]
        await wait_for(lambda: broker.puts.in_progress == 0)
        assert broker.queues.budget.reserved == 0
        queue = broker.queues.get(uri)
        assert queue is not None and not queue.in_flight and queue.in_flight_bytes == 0
        await client.put(1, [guid])  # the retransmission is a new attempt
        assert [a.status for a in await client.acks(1)] == [pb.STATUS_OK]
        assert ready_guids(broker, uri) == [guid]
        assert broker.queues.budget.reserved == 0
        await client.close()

    run_with_broker(scenario)


def test_acks_keep_their_place_before_a_close_response() -> None:
    uri, other = unique_uri("order"), unique_uri("order-other")

    async def scenario(broker: Broker, store: GatedStore) -> None:
        store.held.add(uri)
        client = await AioClient.connect(broker.address)
        await client.open(1, uri, write=True)
        await client.open(2, other, read=True)
        await client.put(1, [new_guid()])
        close = pb.CloseQueue(request_id=client.request_id(), queue_id=2)
        await client.send(pb.ClientFrame(close_queue=close))
        queue = broker.queues.get(other)
        assert queue is not None
        await wait_for(lambda: not queue.consumers)
        # The close was read and applied, but its Response waits behind the ACK.
        assert await client.nothing_within()
        store.release()
        first, second = await client.recv(), await client.recv()
        assert (first.WhichOneof("frame"), second.WhichOneof("frame")) == ("acks", "response")
        assert second.response.request_id == close.request_id
        await client.close()

    run_with_broker(scenario)


def test_pushes_do_not_wait_behind_a_slow_store_write() -> None:
    slow, fast = unique_uri("slow"), unique_uri("fast")

    async def scenario(broker: Broker, store: GatedStore) -> None:
        store.held.add(slow)
        both = await AioClient.connect(broker.address)
        producer = await AioClient.connect(broker.address)
        await both.open(1, slow, write=True)
        await both.open(2, fast, read=True)
        await producer.open(1, fast, write=True)
        await both.put(1, [new_guid()])  # its ACK waits for the store
        guid = new_guid()
        await producer.put(1, [guid])
        assert [a.status for a in await producer.acks(1)] == [pb.STATUS_OK]
        frame = await both.recv()
        assert [p.guid for p in pushes_of(frame.pushes)] == [guid]
        store.release()
        assert [a.status for a in await both.acks(1)] == [pb.STATUS_OK]
        await both.close()
        await producer.close()

    run_with_broker(scenario)


def test_no_push_for_a_handle_follows_its_close_response() -> None:
    """PUSHes still waiting in the outbox when a consumer closes its handle are not
    sent: the messages go back to the queue, and the client sees nothing for the handle
    after the Response that closed it."""
    uri = unique_uri("close-pending")
    payload = b"p" * 1_000_000

    async def scenario(broker: Broker, store: GatedStore) -> None:
        consumer = AioClient(broker.address, receive=False)
        await consumer.send(pb.ClientFrame(hello=pb.Hello(protocol_version=PROTOCOL_VERSION)))
        limits = pb.QueueOptions(max_unconfirmed_messages=1000, max_unconfirmed_bytes=2**30)
        opened = pb.OpenQueue(request_id=1, queue_id=1, uri=uri, read=True, options=limits)
        await consumer.send(pb.ClientFrame(open_queue=opened))
        producer = await AioClient.connect(broker.address)
        await producer.open(1, uri, write=True)
        guids = [new_guid() for _ in range(64)]
        for start in range(0, 64, 4):
            await producer.put(1, guids[start : start + 4], payload)
        await producer.acks(64)
        queue = broker.queues.get(uri)
        assert queue is not None
        (held,) = queue.consumers
        assert len(held.unconfirmed) == 64  # all PUSHed, most still in the outbox
        close = pb.CloseQueue(request_id=2, queue_id=1)
        await consumer.send(pb.ClientFrame(close_queue=close))
        await wait_for(lambda: not queue.consumers)
        consumer.start_receiving()
        assert (await consumer.recv()).WhichOneof("frame") == "hello_reply"
        assert (await consumer.recv()).response.request_id == 1
        received: list[bytes] = []
        while (frame := await consumer.recv()).WhichOneof("frame") != "response":
            received.extend(p.guid for p in pushes_of(frame.pushes))
        assert frame.response.request_id == 2
        assert 0 < len(received) < 64  # gRPC had taken some of them already
        assert await consumer.nothing_within()
        assert [m.guid for m in queue.ready] == guids  # all back, in order
        assert {m.delivery_count for m in queue.ready} == {1}
        await consumer.close()
        await producer.close()

    run_with_broker(scenario)


def test_recovered_messages_and_history() -> None:
    uri = unique_uri("recovered")
    now = 1_000_000.0  # broker-clock times of an earlier run
    delivered_before = StoredMessage(
        uri, new_guid(), b"one", {"k": "v"}, now - 10, 1, content_digest(b"p", {})
    )
    never_delivered = StoredMessage(uri, new_guid(), b"two", {}, now - 5)
    confirmed, expired = new_guid(), new_guid()
    recovered = RecoveredState(
        queues={uri: [delivered_before, never_delivered]},
        history=[
            HistoryEntry(uri, expired, now - 400, 0),  # older than the 300 + 30 s kept
            HistoryEntry(uri, confirmed, now - 20, content_digest(b"p", {})),
            HistoryEntry(uri, delivered_before.guid, now - 10, delivered_before.digest),
            HistoryEntry(uri, never_delivered.guid, now - 5, 0),
        ],
        resume_at=now,
    )

    async def scenario(broker: Broker, store: GatedStore) -> None:
        client = await AioClient.connect(broker.address)
        await client.open(1, uri, read=True, write=True)
        frame = await client.recv()
        pushes = [
            (p.guid, p.payload, dict(p.properties), p.delivery_count)
            for p in pushes_of(frame.pushes)
        ]
        assert pushes == [
            (delivered_before.guid, b"one", {"k": "v"}, 2),
            (never_delivered.guid, b"two", {}, 1),
        ]
        await client.put(1, [confirmed, delivered_before.guid, expired])
        assert [a.status for a in await client.acks(3)] == [pb.STATUS_OK] * 3
        frame = await client.recv()
        assert [p.guid for p in pushes_of(frame.pushes)] == [expired]  # only it was new
        assert store.stored_guids() == [expired]
        await client.close()

    run_with_broker(scenario, GatedStore(recovered))


def test_a_client_that_does_not_read_its_acks_stops_being_read() -> None:
    uri = unique_uri("bound")
    frames, per_frame = 40, 100

    async def scenario(broker: Broker, store: GatedStore) -> None:
        store.held.add(uri)
        client = await AioClient.connect(broker.address)
        await client.open(1, uri, write=True)
        sender = asyncio.get_running_loop().create_task(
            send_all(client, [[new_guid() for _ in range(per_frame)] for _ in range(frames)])
        )
        # ~24 bytes per held ACK against a 4 KiB bound: reading stops after 2 frames.
        await wait_for(lambda: len(store.batches) >= 2)
        assert await client.nothing_within()
        assert len(store.batches) == 2  # the other 38 frames wait, unread
        store.release()
        acks = await client.acks(frames * per_frame)
        assert {a.status for a in acks} == {pb.STATUS_OK}
        assert len(broker.queues.get(uri).ready) == frames * per_frame  # type: ignore[union-attr]
        await sender
        await client.close()

    run_with_broker(scenario, session_read_bound_bytes=4096)


async def send_all(client: AioClient, batches: list[list[bytes]]) -> None:
    for guids in batches:
        await client.put(1, guids)


def test_a_failure_inside_one_session_ends_only_that_session() -> None:
    uri = unique_uri("isolated")

    async def scenario(broker: Broker, store: GatedStore) -> None:
        original = broker.puts.on_put_batch

        def explode(
            puts: Any, handles: Any, outbox: Any, writer: Any, spans: Any = None, commit: Any = None
        ) -> None:
            if b"boom" in puts.payloads:
                raise RuntimeError("a bug in the PUT path")
            original(puts, handles, outbox, writer, spans, commit)

        broker.puts.on_put_batch = explode  # type: ignore[method-assign]
        victim = await AioClient.connect(broker.address)
        other = await AioClient.connect(broker.address)
        await victim.open(1, uri, read=True, write=True)
        await other.open(1, uri, write=True)
        await victim.put(1, [new_guid()], b"boom")
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await victim.recv()
        assert ended.value.code() == grpc.StatusCode.INTERNAL
        guid = new_guid()
        await other.put(1, [guid])
        assert [a.status for a in await other.acks(1)] == [pb.STATUS_OK]
        assert ready_guids(broker, uri) == [guid]  # the victim's consumer is gone
        assert broker.sessions == 1
        await victim.close()
        await other.close()

    run_with_broker(scenario)


def test_stop_tells_sessions_and_refuses_new_ones() -> None:
    async def scenario(broker: Broker, store: GatedStore) -> None:
        client = await AioClient.connect(broker.address)
        stopping = asyncio.create_task(broker.stop())
        frame = await client.recv()
        assert (frame.error.status, frame.error.fatal) == (pb.STATUS_SHUTTING_DOWN, True)
        await client.ended()
        await stopping
        await client.close()
        late = AioClient(broker.address)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await late.recv()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        await late.close()

    run_with_broker(scenario)


async def wait_for(condition: Callable[[], object], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)

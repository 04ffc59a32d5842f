"""``Session`` of the asyncio API: the same engine and contract as the threaded one.

It runs on the caller's event loop, on the same connection driver as the proxy's
upstream link (``holdfast.sdk.driver.aio_session``): callbacks (``on_ack``,
``on_event``, ``on_message``) run on the loop, in order, and nothing blocks it.
Rule 7's wait, the only place a post can wait, is awaited.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from holdfast.sdk import instrument, metrics, tracing
from holdfast.sdk.aio import durable as aio_durable
from holdfast.sdk.aio.queue import Queue
from holdfast.sdk.aio.rpc import AsyncCaller
from holdfast.sdk.aio.streams import AsyncSource
from holdfast.sdk.driver.aio_session import AsyncEngineSession
from holdfast.sdk.errors import SessionClosedError
from holdfast.sdk.events import ConnectionLost, DataLost, SessionEvent, log_event
from holdfast.sdk.failover import parse_addresses
from holdfast.sdk.handlers import reject_on_failure
from holdfast.sdk.options import QueueOptions, SessionOptions, default_address
from holdfast.sdk.producer import check_callback
from holdfast.sdk.rpc import durable
from holdfast.sdk.rpc.values import Reply
from holdfast.sdk.stats import SessionStats
from holdfast.sdk.transports.base import AsyncTransport
from holdfast.sdk.types import Ack, Message


class Session:
    """An asyncio connection to a Holdfast proxy or broker that survives its failures.

    ::

        async with Session("127.0.0.1:7701") as session:
            queue = await session.open_queue("hf://demo/orders", write=True)
            guid = await queue.post(b"payload")
            await session.flush(timeout=30)

    ``address`` is ``"host:port"`` or a comma-separated failover list; by default
    ``$HOLDFAST_ADDRESS`` or ``127.0.0.1:7701``. ``transport`` replaces gRPC (for
    example ``holdfast.sdk.testing``'s in-memory broker).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        on_event: Callable[[SessionEvent], Any] | None = None,
        options: SessionOptions | None = None,
        transport: AsyncTransport | None = None,
    ) -> None:
        self._addresses = parse_addresses(address or default_address())
        self._options = options or SessionOptions()
        self._telemetry = self._options.telemetry and tracing.AVAILABLE
        check_callback("on_event", on_event)
        application_on_event = on_event or log_event

        def route_event(event: SessionEvent) -> None:
            if isinstance(event, ConnectionLost):
                # Deliveries of the lost connection are stale (their CONFIRM would be
                # dropped; the broker redelivers them): iterators never see them, and
                # an inbox holds at most one connection's flow limits.
                for queue in list(self._queues):
                    queue.discard_delivered()
            elif isinstance(event, DataLost) and event.queue_uri is None and self._caller:
                self._caller.store_lost(event.message)
            application_on_event(event)

        self._core = AsyncEngineSession(
            self._addresses,
            self._options,
            route_event,
            client_id=str(uuid.uuid4()),
            transport=transport,
            telemetry=self._telemetry,
        )
        if self._telemetry:
            metrics.watch(self)
        self._started = False
        self._closed = False
        self._queues: weakref.WeakSet[Queue] = weakref.WeakSet()
        self._caller: AsyncCaller | None = None

    async def __aenter__(self) -> Session:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._core.start()

    # ------------------------------------------------------------------ public API

    @property
    def addresses(self) -> list[str]:
        """The addresses this session fails over across, in order."""
        return list(self._addresses)

    @property
    def client_id(self) -> str:
        """The id this session announces to the broker (``holdfast.client.id`` in its
        OpenTelemetry metrics)."""
        return self._core.engine.client_id

    @property
    def pending_count(self) -> int:
        """PUTs posted and not yet reported to their ``on_ack``."""
        return self._core.engine.pending_count

    @property
    def connected(self) -> bool:
        """True while the broker has answered Hello on the current connection."""
        return self._core.engine.connected

    def stats(self) -> SessionStats:
        """A snapshot of this session's client counters (``holdfast.sdk.SessionStats``):
        buffered PUTs and bytes, ACKs by status, reconnects, retransmits, posts that
        waited, messages delivered, confirmed and rejected."""
        return self._core.engine.stats()

    async def open_queue(
        self,
        uri: str,
        *,
        read: bool = False,
        write: bool = False,
        on_message: Callable[[Message], Any] | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
        options: QueueOptions | None = None,
        timeout: float = 30.0,
    ) -> Queue:
        """Open ``hf://<domain>/<queue>``; return once the broker has opened it.

        With ``read=True`` and no ``on_message``, iterate the returned queue
        (``async for message in queue``); ``on_message`` instead calls back on the
        loop. ``on_ack`` is the default ACK callback for PUTs posted without one.
        ``RequestTimeoutError`` after ``timeout`` seconds.
        """
        check_callback("on_message", on_message)
        check_callback("on_ack", on_ack)
        self._start()
        inbox: asyncio.Queue[Message] | None = None
        if read and on_message is None:
            inbox = asyncio.Queue()
            on_message = inbox.put_nowait
        elif on_message is not None:
            if self._telemetry:
                on_message = instrument.traced_handler(on_message)
            # As in the threaded session: a handler that raises never keeps its message.
            on_message = reject_on_failure(on_message, options or QueueOptions())
        record = await self._core.open_queue(
            uri,
            read=read,
            write=write,
            options=options or QueueOptions(),
            on_message=on_message,
            on_ack=on_ack,
            timeout=timeout,
        )
        queue = Queue(self, record, inbox, traced=self._telemetry)
        self._queues.add(queue)
        return queue

    async def request(
        self,
        uri: str,
        payload: bytes,
        *,
        properties: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        key: str | None = None,
        pickup_timeout: float | None = None,
        streams: Mapping[str, AsyncSource] | None = None,
    ) -> Reply:
        """Call the service whose workers consume ``uri`` and await its one reply.

        The same calls as the synchronous ``Session.request`` (``holdfast.sdk.rpc``),
        with the same typed ``RpcError`` failures; cancelling the awaiting task
        cancels the call and tells its worker. ``streams`` maps names to binary
        file-like objects (read in the loop's default executor) or async iterables
        of bytes, sent beside the request: the handler reads them as
        ``request.streams[name]`` (``StreamError`` if one cannot complete). A
        ``StreamingReply``'s streams are ``reply.streams[name]``, read with
        ``async for`` or ``await ....read(n)`` (``holdfast.sdk.aio.streams``).
        """
        return await self._rpc().call(
            uri,
            payload,
            properties=properties,
            timeout=timeout,
            key=key,
            pickup_timeout=pickup_timeout,
            streams=streams,
        )

    async def request_durable(
        self,
        uri: str,
        payload: bytes,
        *,
        properties: Mapping[str, str] | None = None,
        key: str | None = None,
        keep: float = durable.DEFAULT_REPLY_KEEP,
        timeout: float = 30.0,
    ) -> str:
        """Post a durable request; its request id once the broker ACKed it. As the
        synchronous ``Session.request_durable`` (``holdfast.sdk.rpc.durable``)."""
        return await aio_durable.post_durable(
            self._rpc(),
            self._options.token,
            uri,
            payload,
            properties=properties,
            key=key,
            keep=keep,
            timeout=timeout,
        )

    async def fetch_reply(self, request_id: str, timeout: float = 30.0) -> Reply:
        """The reply of the durable request ``request_id`` (from any session of the
        same token); as the synchronous ``Session.fetch_reply``."""
        self._start()
        return await aio_durable.fetch(self, self._options.token, request_id, timeout)

    def _rpc(self) -> AsyncCaller:
        self._start()
        if self._caller is None:
            if self._closed:
                raise SessionClosedError("the session is closed")
            self._caller = AsyncCaller(self)
        return self._caller

    async def has_workers(self, uri: str, timeout: float = 10.0) -> bool:
        """True if ``uri`` has a live consumer now (request/reply service discovery)."""
        self._start()
        return await self._core.count_consumers(uri, timeout) > 0

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every PUT posted so far is reported (its ``on_ack`` has run);
        True if so within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        engine, driver = self._core.engine, self._core.driver
        while engine.pending_count:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            await driver.wait_changed(remaining)
        return True

    async def close(self, timeout: float | None = None) -> None:
        """Close the session: flush for up to ``timeout`` seconds (default
        ``SessionOptions.close_timeout``); send what is queued (the CONFIRMs issued
        before this call) and end the stream, waiting up to 2 s more for the broker to
        read it; then report what is still pending as ``UNKNOWN``, emit
        ``SessionClosed`` and end every queue's iteration."""
        if self._closed:
            return
        self._closed = True
        metrics.unwatch(self)
        wait = self._options.close_timeout if timeout is None else timeout
        if self._caller is not None:
            await self._caller.close(wait)
        if self._started:
            await self.flush(wait)
        await self._core.stop()
        for queue in list(self._queues):
            queue.end_iteration()

    # ------------------------------------------------------------------ used by Queue

    async def _post(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        guid: uuid.UUID | None,
    ) -> uuid.UUID:
        if self._telemetry and tracing.configured():
            engine = self._core.engine
            span, properties, on_ack = instrument.prepare_post(
                engine.queue(queue_id), properties, on_ack, guid is not None, engine.limits
            )
            if span is not None:
                try:
                    return await self._post_now(queue_id, payload, properties, on_ack, guid)
                except BaseException as error:
                    tracing.fail(span, error)
                    raise
        return await self._post_now(queue_id, payload, properties, on_ack, guid)

    async def _post_many(
        self,
        queue_id: int,
        payloads: Sequence[bytes],
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
    ) -> list[uuid.UUID]:
        if self._telemetry and tracing.configured():  # a span per message, as post() makes
            return [await self._post(queue_id, p, properties, on_ack, None) for p in payloads]
        engine = self._core.engine
        if self._core.driver.turn_due(len(payloads)):
            await asyncio.sleep(0)  # the writer's turn: ``driver.aio.YIELD_EVERY``
        now = time.monotonic()
        if engine.admit_post(now, now, queue_id) > 0:
            now = await self._admission_wait(queue_id, now)
        guids = engine.post_many(queue_id, payloads, properties, on_ack, now)
        self._core.driver.outbound_queued()
        return guids

    async def _admission_wait(self, queue_id: int, since: float) -> float:
        """Rule 7: wait while the engine holds posts to ``queue_id`` back (it raises once
        the wait is over); the time the post may go ahead. Only a post that was held
        comes here: the free path costs one ``admit_post`` call and no coroutine."""
        engine = self._core.engine
        engine.note_admission_wait(queue_id)
        now = since
        while (delay := engine.admit_post(since, now, queue_id)) > 0:
            await self._core.driver.wait_changed(delay)
            now = time.monotonic()
        return now

    async def _post_now(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        on_ack: Callable[[Ack], Any] | None,
        guid: uuid.UUID | None,
    ) -> uuid.UUID:
        engine = self._core.engine
        if self._core.driver.turn_due():
            await asyncio.sleep(0)  # the writer's turn: ``driver.aio.YIELD_EVERY``
        now = time.monotonic()
        if engine.admit_post(now, now, queue_id) > 0:
            now = await self._admission_wait(queue_id, now)
        if guid is None:
            guid = engine.buffer(queue_id, payload, properties, on_ack, now, None)
        else:
            guid = engine.post(queue_id, payload, properties, on_ack, now, guid)
        self._core.driver.outbound_queued()
        return guid

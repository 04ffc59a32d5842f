"""``AsyncEngineSession``: one engine on the asyncio driver, with awaitable requests.

The common part of every asyncio front-end: the proxy's upstream link
(``holdfast.proxy.upstream``) and the public asyncio API (``holdfast.sdk.aio``).
It owns the engine and its ``AsyncDriver`` and turns open, configure, close and
consumer-count requests into coroutines that wait for the broker's answer.
Everything runs on one event loop, so no locks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from holdfast.sdk import instrument, tracing
from holdfast.sdk.driver.aio import AsyncDriver
from holdfast.sdk.engine import QueueRecord, SessionEngine, WireAck, WirePushes
from holdfast.sdk.errors import RequestTimeoutError
from holdfast.sdk.events import SessionEvent
from holdfast.sdk.options import QueueOptions, SessionOptions
from holdfast.sdk.transports.base import AsyncTransport
from holdfast.sdk.transports.grpc_aio import GrpcAioTransport
from holdfast.sdk.types import Ack, Message, Rejection


class AsyncEngineSession:
    """An engine driven on the running loop (call ``start`` from a coroutine)."""

    def __init__(
        self,
        addresses: list[str],
        options: SessionOptions,
        on_event: Callable[[SessionEvent], Any],
        *,
        client_id: str,
        transport: AsyncTransport | None = None,
        on_wire_acks: Callable[[list[WireAck]], Any] | None = None,
        wire_pushes: bool = False,
        telemetry: bool = False,
        retry_refusals: bool = False,
    ) -> None:
        self.options = options
        self.telemetry = telemetry
        """Settlements get OpenTelemetry spans (``holdfast.sdk.instrument``)."""
        self.engine = SessionEngine(
            client_id=client_id or str(uuid.uuid4()),
            client_name=options.client_name,
            on_event=on_event,
            confirmer=self.confirm,
            high_watermark_bytes=options.high_watermark_bytes,
            max_disconnected_buffer_bytes=options.max_disconnected_buffer_bytes,
            wire_acks=on_wire_acks is not None,
            wire_pushes=wire_pushes,
            retry_refusals=retry_refusals,
        )
        self.driver = AsyncDriver(
            self.engine,
            addresses,
            options,
            transport or GrpcAioTransport(options),
            on_wire_acks=on_wire_acks,
        )

    def start(self) -> None:
        """Start connecting (on the running loop)."""
        self.driver.start()

    async def stop(self) -> None:
        """Close the engine (pending PUTs are reported UNKNOWN) and the connection."""
        await self.driver.stop()

    async def wait_connected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a broker to have answered Hello."""
        deadline = time.monotonic() + timeout
        while not self.engine.ever_connected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self.driver.wait_changed(remaining)
        return True

    async def open_queue(
        self,
        uri: str,
        *,
        read: bool,
        write: bool,
        options: QueueOptions,
        on_message: Callable[[Message], Any] | Callable[[WirePushes], Any] | None,
        timeout: float,
        on_ack: Callable[[Ack], Any] | None = None,
        for_client: str = "",
    ) -> QueueRecord:
        """Open a queue; buffered until the broker is reachable. ``RequestTimeoutError``
        after ``timeout`` seconds (the open is then given up). ``for_client``: a proxy's
        client the handle is for."""
        record, request_id = self.engine.open_queue(
            uri,
            read=read,
            write=write,
            options=options,
            on_message=on_message,
            on_ack=on_ack,
            for_client=for_client,
        )
        try:
            await self.driver.wait_request(request_id, timeout, f"opening {uri}")
        except RequestTimeoutError:
            self.engine.abandon_open(record.queue_id)
            self.driver.after_input()
            raise
        return record

    async def configure_queue(self, queue_id: int, options: QueueOptions, timeout: float) -> None:
        """Change a queue's options (kept for reopens even if this times out)."""
        request_id = self.engine.configure_queue(queue_id, options)
        await self.driver.wait_request(request_id, timeout, "configuring a queue")

    async def close_queue(self, queue_id: int, timeout: float) -> None:
        """Close a queue (locally while disconnected)."""
        request_id = self.engine.close_queue(queue_id)
        self.driver.after_input()
        if request_id is not None:
            await self.driver.wait_request(request_id, timeout, "closing a queue")

    async def count_consumers(self, uri: str, timeout: float) -> int:
        """How many live consumers ``uri`` has at the broker (asked again after a reconnect)."""
        request_id = self.engine.count_consumers(uri)
        try:
            await self.driver.wait_request(request_id, timeout, f"counting the consumers of {uri}")
        finally:
            count = self.engine.queries.take_answer(request_id)
        return count or 0

    def confirm(self, message: Message, reject: Rejection | None = None) -> None:
        """CONFIRM (or REJECT) a message delivered on the current connection (rule 5
        otherwise, and once the session is closing)."""
        if self.telemetry and tracing.configured():
            with instrument.settling(message, reject is not None):
                self.engine.confirm(message, reject)
        else:
            self.engine.confirm(message, reject)
        self.driver.outbound_queued()

"""The proxy's session to the broker: the SDK's engine on the SDK's asyncio driver.

Every HA rule (buffer PUTs until ACKed, reopen queues and retransmit after a
reconnect, drop stale CONFIRMs, close locally while disconnected, the dedup
window) comes from ``holdfast.sdk.engine``; connections, failover, the Hello
deadline and error containment from ``holdfast.sdk.driver.aio``. This module
only adapts them to the proxy's routing: it runs on the proxy's event loop, so
it needs no locks, and PUT outcomes reach ``on_acks`` as (GUID, wire status)
pairs, relayed to clients as they are.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from holdfast.proto.limits import Limits
from holdfast.sdk.driver.aio import AsyncDriver
from holdfast.sdk.engine import QueueRecord, SessionEngine, WireAck
from holdfast.sdk.errors import RequestTimeoutError
from holdfast.sdk.events import SessionEvent, log_event
from holdfast.sdk.options import QueueOptions, SessionOptions
from holdfast.sdk.transports.base import AsyncTransport
from holdfast.sdk.transports.grpc_aio import GrpcAioTransport
from holdfast.sdk.types import Message


class Upstream:
    """One HA session to the first reachable broker of an ordered list."""

    def __init__(
        self,
        addresses: list[str],
        options: SessionOptions,
        on_acks: Callable[[list[WireAck]], Any],
        on_event: Callable[[SessionEvent], Any] = log_event,
        transport: AsyncTransport | None = None,
    ) -> None:
        self.engine = SessionEngine(
            client_id=f"proxy-{uuid.uuid4()}",
            client_name=options.client_name or "holdfast-proxy",
            on_event=on_event,
            confirmer=self.confirm,
            high_watermark_bytes=options.high_watermark_bytes,
            wire_acks=True,
        )
        self._driver = AsyncDriver(
            self.engine,
            addresses,
            options,
            transport or GrpcAioTransport(options),
            on_wire_acks=on_acks,
        )

    def start(self) -> None:
        """Start connecting (on the running loop)."""
        self._driver.start()

    async def stop(self) -> None:
        """Close the session: pending PUTs are reported UNKNOWN to their routes."""
        await self._driver.stop()

    @property
    def limits(self) -> Limits:
        """What the broker last announced (defaults until it has)."""
        return self.engine.limits

    async def wait_connected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a broker to have answered Hello."""
        deadline = time.monotonic() + timeout
        while not self.engine.ever_connected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self._driver.wait_changed(remaining)
        return True

    async def wait_below_high_watermark(self) -> None:
        """Wait while the upstream transport pushes back (the caller stops reading its
        client meanwhile, which pushes back on that client in turn)."""
        while self.engine.over_high_watermark():
            await self._driver.wait_changed()

    async def open_queue(
        self,
        uri: str,
        *,
        read: bool,
        write: bool,
        options: QueueOptions,
        on_message: Callable[[Message], Any] | None,
        timeout: float,
    ) -> QueueRecord:
        """Open a queue upstream; buffered until the broker is reachable."""
        record, request_id = self.engine.open_queue(
            uri, read=read, write=write, options=options, on_message=on_message, on_ack=None
        )
        try:
            await self._driver.wait_request(request_id, timeout, f"opening {uri}")
        except RequestTimeoutError:
            self.engine.abandon_open(record.queue_id)
            self._driver.after_input()
            raise
        return record

    async def configure_queue(self, queue_id: int, options: QueueOptions, timeout: float) -> None:
        """Change a queue's options upstream."""
        request_id = self.engine.configure_queue(queue_id, options)
        await self._driver.wait_request(request_id, timeout, "configuring a queue")

    async def close_queue(self, queue_id: int, timeout: float) -> None:
        """Close a queue upstream (locally while disconnected)."""
        request_id = self.engine.close_queue(queue_id)
        self._driver.after_input()
        if request_id is not None:
            await self._driver.wait_request(request_id, timeout, "closing a queue")

    async def count_consumers(self, uri: str, timeout: float) -> int:
        """How many live consumers ``uri`` has at the broker (asked again after a reconnect)."""
        request_id = self.engine.count_consumers(uri)
        try:
            await self._driver.wait_request(request_id, timeout, f"counting the consumers of {uri}")
        finally:
            count = self.engine.queries.take_answer(request_id)
        return count or 0

    def relay(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        guid: bytes,
        age_ms: int = 0,
    ) -> bool:
        """Buffer a client's PUT under the client's GUID (16 bytes), as old as it arrived
        (``age_ms``: a proxy never restarts a PUT's age); its outcome reaches ``on_acks``.
        False if that GUID is already pending here (nothing is buffered)."""
        now = time.monotonic()
        if not self.engine.relay(queue_id, payload, properties, guid, now, age_ms):
            return False
        self._driver.outbound_queued()
        return True

    def confirm(self, message: Message) -> None:
        """CONFIRM a message delivered on the current upstream connection."""
        self.engine.confirm(message)
        self._driver.outbound_queued()

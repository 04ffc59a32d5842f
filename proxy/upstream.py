"""The proxy's session to the broker: the SDK's engine on the SDK's asyncio driver.

Every HA rule (buffer PUTs until ACKed, reopen queues and retransmit after a
reconnect, drop stale CONFIRMs, close locally while disconnected, the dedup
window) comes from ``holdfast.sdk.engine``; connections, failover, the Hello
deadline, error containment and awaitable requests from
``holdfast.sdk.driver.aio_session`` (shared with the public asyncio API). This
module only adapts them to the proxy's routing: PUT outcomes reach ``on_acks``
as (GUID, wire status) pairs, and PUSHes each handle's ``on_message`` by runs as
``WirePushes`` (the broker's PUSHes as read and their connection generation), relayed
to clients as they are: no ``Message`` is made for a PUSH that only passes through.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from holdfast.proto.limits import Limits
from holdfast.sdk.driver.aio_session import AsyncEngineSession
from holdfast.sdk.engine import WireAck
from holdfast.sdk.events import SessionEvent, log_event
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.relaying import Relayed
from holdfast.sdk.transports.base import AsyncTransport


class Upstream(AsyncEngineSession):
    """One HA session to the first reachable broker of an ordered list."""

    def __init__(
        self,
        addresses: list[str],
        options: SessionOptions,
        on_acks: Callable[[list[WireAck]], Any],
        on_event: Callable[[SessionEvent], Any] = log_event,
        transport: AsyncTransport | None = None,
    ) -> None:
        if not options.client_name:
            options = dataclasses.replace(options, client_name="holdfast-proxy")
        super().__init__(
            addresses,
            options,
            on_event,
            client_id=f"proxy-{uuid.uuid4()}",
            transport=transport,
            on_wire_acks=on_acks,
            wire_pushes=True,
            # A broker that refuses the proxy (another protocol version, its token) is
            # tried again, and the next address after it: the proxy serves as long as it
            # runs, and its clients are told why no broker is reachable meanwhile.
            retry_refusals=True,
        )

    def unreachable(self) -> str | None:
        """Why no broker has answered yet, once an attempt to reach one failed (None
        while connected, or while the first attempts are still under way)."""
        core = self.driver.core
        if self.engine.connected or not core.failed_attempts:
            return None
        return core.why_not_connected()

    @property
    def limits(self) -> Limits:
        """What the broker last announced (defaults until it has)."""
        return self.engine.limits

    async def wait_below_high_watermark(self) -> None:
        """Wait while the upstream transport pushes back (the caller stops reading its
        client meanwhile, which pushes back on that client in turn)."""
        while self.engine.over_high_watermark():
            await self.driver.wait_changed()

    def relay(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        guid: bytes,
        age_ms: int = 0,
    ) -> Relayed:
        """Buffer a client's PUT under the client's GUID (16 bytes), as old as it arrived
        (``age_ms``: a proxy never restarts a PUT's age); its outcome reaches ``on_acks``.
        A GUID pending here already is judged by queue and content (``Relayed``)."""
        outcome = self.engine.relay(queue_id, payload, properties, guid, time.monotonic(), age_ms)
        if outcome is Relayed.SENT:
            self.driver.outbound_queued()
        return outcome

    def queued(self) -> None:
        """A client frame's PUTs or CONFIRMs went straight into the engine
        (``engine.relay``, with the clock read once per frame, or
        ``engine.confirm_wire``): wake the writer once for all of them. Per message,
        the clock read and the wake-up were a tenth of the proxy's work."""
        self.driver.outbound_queued()

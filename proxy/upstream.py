"""The proxy's session to the broker: the SDK's ``SessionEngine`` driven by asyncio.

Every HA rule (buffer PUTs until ACKed, reopen queues and retransmit after a
reconnect, drop stale CONFIRMs, close locally while disconnected, the dedup
window) comes from ``holdfast.sdk.engine``; this module is only the I/O shell:
a gRPC ``aio`` stream per connection, a reader and a writer task, failover
with ``holdfast.sdk.failover.FailoverPolicy``, and futures for requests. It
runs on the proxy's event loop, so it needs no locks, and the engine's
callbacks (the proxy's routing functions) run right away, on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from holdfast.proto import SESSION_METHOD, pb
from holdfast.proto.limits import Limits
from holdfast.sdk.engine import QueueRecord, SessionEngine, WireAck
from holdfast.sdk.errors import HoldfastError, RequestTimeoutError, TerminalTransportError
from holdfast.sdk.events import ConnectAttemptFailed, SessionEvent, log_event
from holdfast.sdk.failover import FailoverPolicy
from holdfast.sdk.frames import encode
from holdfast.sdk.options import QueueOptions, SessionOptions
from holdfast.sdk.transport import channel_options, classify_rpc_error
from holdfast.sdk.types import Message

log = logging.getLogger("holdfast.proxy.upstream")


class Upstream:
    """One HA session to the first reachable broker of an ordered list."""

    def __init__(
        self,
        addresses: list[str],
        options: SessionOptions,
        on_acks: Callable[[list[WireAck]], Any],
        on_event: Callable[[SessionEvent], Any] = log_event,
    ) -> None:
        self._options = options
        self._policy = FailoverPolicy(addresses, options.reconnect)
        # PUT outcomes come as (GUID, wire status) pairs for ``on_acks`` to route: the
        # proxy relays them as they are, with no UUID and Ack object per message.
        self._on_acks = on_acks
        self.engine = SessionEngine(
            client_id=f"proxy-{uuid.uuid4()}",
            client_name=options.client_name or "holdfast-proxy",
            on_event=on_event,
            confirmer=self.confirm,
            high_watermark_bytes=options.high_watermark_bytes,
            wire_acks=True,
        )
        self._requests: dict[int, asyncio.Future[None]] = {}
        self._outbound_ready = asyncio.Event()
        self._state_changed = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start connecting (on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._connect_loop())

    async def stop(self) -> None:
        """Close the session: pending PUTs are reported UNKNOWN to their routes."""
        self._stopping = True
        self.engine.close()
        self._after_input()
        if self._call is not None:
            self._call.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ------------------------------------------------------------------ queries

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
            self._state_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state_changed.wait(), remaining)
        return True

    async def wait_below_high_watermark(self) -> None:
        """Wait while the upstream transport pushes back (the caller stops reading its
        client meanwhile, which pushes back on that client in turn)."""
        while self.engine.over_high_watermark():
            self._state_changed.clear()
            await self._state_changed.wait()

    # ------------------------------------------------------------------ application inputs

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
        """Open a queue upstream; buffered until the broker is reachable. The outcomes of
        its PUTs go to ``on_acks``."""
        record, request_id = self.engine.open_queue(
            uri, read=read, write=write, options=options, on_message=on_message, on_ack=None
        )
        try:
            await self._wait_request(request_id, timeout, f"opening {uri}")
        except RequestTimeoutError:
            self.engine.abandon_open(record.queue_id)
            self._after_input()
            raise
        return record

    async def configure_queue(self, queue_id: int, options: QueueOptions, timeout: float) -> None:
        """Change a queue's options upstream."""
        request_id = self.engine.configure_queue(queue_id, options)
        await self._wait_request(request_id, timeout, "configuring a queue")

    async def close_queue(self, queue_id: int, timeout: float) -> None:
        """Close a queue upstream (locally while disconnected)."""
        request_id = self.engine.close_queue(queue_id)
        self._after_input()
        if request_id is not None:
            await self._wait_request(request_id, timeout, "closing a queue")

    def relay(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        guid: bytes,
    ) -> bool:
        """Buffer a client's PUT under the client's GUID (16 bytes); its outcome reaches
        ``on_acks``. False if that GUID is already pending here (nothing is buffered)."""
        if not self.engine.relay(queue_id, payload, properties, guid, time.monotonic()):
            return False
        self._outbound_ready.set()
        return True

    def confirm(self, message: Message) -> None:
        """CONFIRM a message delivered on the current upstream connection."""
        self.engine.confirm(message)
        self._outbound_ready.set()

    # ------------------------------------------------------------------ plumbing

    async def _wait_request(self, request_id: int, timeout: float, what: str) -> None:
        future = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        self._after_input()
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RequestTimeoutError(f"{what} did not complete within {timeout} s") from None
        finally:
            self._requests.pop(request_id, None)

    def _after_input(self) -> None:
        """Route PUT outcomes, run the engine's callbacks and settle its completions, on
        the loop (outcomes first: a close is answered after the ACKs posted before it)."""
        engine = self.engine
        acks = engine.take_wire_acks()
        if acks:
            try:
                self._on_acks(acks)
            except Exception:
                log.exception("routing upstream ACKs raised; continuing")
        for function, argument in engine.take_callbacks():
            try:
                function(argument)
            except Exception:
                log.exception("a proxy routing callback raised; continuing")
        for request_id, error in engine.take_completions():
            future = self._requests.get(request_id)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
        if engine.has_outbound:
            self._outbound_ready.set()
        self._state_changed.set()

    async def _connect_loop(self) -> None:
        while not self._stopping:
            address = self._policy.current
            try:
                established, reason = await self._run_link(address)
            except TerminalTransportError as exc:
                log.error("upstream %s failed terminally: %s", address, exc)
                self.engine.fail(exc)
                self._after_input()
                return
            if self._stopping:
                return
            delay = self._policy.connection_ended(established)
            if not established:
                self.engine.emit(ConnectAttemptFailed(address, reason, delay))
                self._after_input()
            await asyncio.sleep(delay)

    async def _run_link(self, address: str) -> tuple[bool, str]:
        """Run one connection to ``address`` until it ends; return (established, reason)."""
        channel = grpc.aio.insecure_channel(address, options=channel_options(self._options))
        call = channel.stream_stream(
            SESSION_METHOD,
            request_serializer=pb.ClientFrame.SerializeToString,
            response_deserializer=pb.ServerFrame.FromString,
        )()
        self._call = call
        generation = self.engine.connection_made(address)
        self._after_input()
        writer = asyncio.get_running_loop().create_task(self._write_loop(call, generation))
        established = False
        reason = "the broker ended the stream"
        try:
            while True:
                # A peer that accepts TCP but never answers Hello must not hold us forever.
                timeout = None if established else self._options.connect_timeout
                frame = await asyncio.wait_for(call.read(), timeout)
                if frame is grpc.aio.EOF:
                    break
                self.engine.frame_received(generation, frame, time.monotonic())
                established = established or self.engine.connected
                self._after_input()
        except TimeoutError:
            reason = f"no answer to Hello within {self._options.connect_timeout} s"
        except grpc.RpcError as exc:
            error = classify_rpc_error(exc)
            if isinstance(error, TerminalTransportError):
                raise error from exc
            reason = str(error)
        except HoldfastError as exc:
            reason = str(exc)
        finally:
            writer.cancel()
            call.cancel()
            self._call = None
            self.engine.connection_lost(generation, reason)
            self._after_input()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
            await channel.close()
        return established, reason

    async def _write_loop(self, call: Any, generation: int) -> None:
        """Send what the engine queues, batched; ``call.write`` waits on gRPC flow
        control, and meanwhile PUTs pile up and count against the high watermark."""
        engine = self.engine
        max_batch = self._options.max_batch_bytes
        while engine.generation == generation:
            if not engine.has_outbound:
                self._outbound_ready.clear()
                await self._outbound_ready.wait()
                continue
            for frame, nbytes in encode(engine.take_outbound(), max_batch):
                try:
                    await call.write(frame)
                except (grpc.RpcError, asyncio.InvalidStateError):
                    return  # the reader sees the stream fail and reports it
                engine.transport_drained(nbytes)
                self._state_changed.set()

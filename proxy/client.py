"""One application connected to the proxy: its queue handles, routed onto the upstream.

Each handle a client opens becomes a queue handle of the proxy's one upstream
session (``holdfast.proxy.upstream.Upstream``), so each consumer keeps its own
flow limits at the broker and the proxy knows whose PUSH is whose:

- a PUT keeps the client's GUID upstream (so the broker's dedup works end to end)
  and its ACK is routed back to the client that posted it, by GUID. A GUID
  already pending upstream (the client retransmitting after it lost the proxy)
  is not posted twice: its route moves to the new stream;
- a PUSH goes to the client whose handle it was delivered to;
- a CONFIRM goes upstream only for a message delivered on the current upstream
  connection; one delivered on an earlier connection is answered as stale
  (UNKNOWN_GUID), since the broker has already taken it back for redelivery. A
  CONFIRM names only a GUID, so when the client holds a stale delivery and the
  redelivery of one message, it settles the redelivery (the client processed the
  message either way) and a second CONFIRM of that GUID is refused as stale;
- when the client goes, its upstream handles are closed, so the broker
  redelivers what it held unconfirmed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from operator import itemgetter
from typing import Any

from holdfast.proto import NO_BROKER, pb
from holdfast.proto.columns import PutColumns, RejectRow
from holdfast.proto.limits import MAX_REJECT_DELAY_MS, hello_reply
from holdfast.proto.validate import Invalid, check_open, parse_queue_uri
from holdfast.proxy.config import ProxyConfig
from holdfast.proxy.opening import OpenWaits
from holdfast.proxy.relay import PutRelay
from holdfast.proxy.routes import ClientHandle, ProxyCounters, Routes, record_deliveries
from holdfast.proxy.settle import ConfirmRelay
from holdfast.proxy.upstream import Upstream
from holdfast.sdk.engine import QueueRecord
from holdfast.sdk.errors import HoldfastError, QueueStateError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.outcomes import WirePushes
from holdfast.sdk.statuses import relay_status
from holdfast.sdk.types import Rejection
from holdfast.server import spans
from holdfast.server.guard import SessionGuard
from holdfast.server.outbox import AckEntry, AckGroup
from holdfast.server.stream import ContractStream

log = logging.getLogger(__name__)

UPSTREAM_CHECK = 0.25
"""Seconds between looks at the upstream while a client's Hello waits for a broker."""

_status_of = itemgetter(2)
"""The status of an ``AckEntry``."""


class ClientSession(ContractStream):
    """Serves one client stream by routing it onto the proxy's upstream session."""

    def __init__(
        self,
        context: Any,
        session_id: str,
        config: ProxyConfig,
        upstream: Upstream,
        routes: Routes,
        counters: ProxyCounters | None = None,
        guard: SessionGuard | None = None,
    ) -> None:
        super().__init__(
            context, session_id, config.max_frame_bytes, config.read_bound_bytes, guard
        )
        self._counters = counters if counters is not None else ProxyCounters()
        self._config = config
        self._upstream = upstream
        self._routes = routes
        self._route_key = routes.register(self)
        self._relay = PutRelay(upstream, routes, self._route_key, self.guard, session_id, self.ack)
        self._handles: dict[int, ClientHandle] = {}
        self._confirms = ConfirmRelay(upstream, self._handles)
        self._spans = spans.RelaySpans()
        """``relay`` spans of this client's traced PUTs, until their ACK."""
        self._acks: AckGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._opens = OpenWaits()
        self._frame_bytes = 0
        """Wire size of the client frame being handled."""

    def handles_on(self, uri: str) -> list[ClientHandle]:
        """This client's handles on ``uri``."""
        return [handle for handle in self._handles.values() if handle.uri == uri]

    def greet(self, hello: pb.Hello) -> None:
        """Answer Hello with the broker's limits, once the upstream has learnt them: a
        proxy never announces a dedup window or limit no broker announced."""
        if self._upstream.engine.ever_connected:
            self._send_hello_reply()
        else:
            self._spawn(self._greet_when_connected())

    async def _greet_when_connected(self) -> None:
        """Wait for the first broker; refuse the client at once (naming the upstream and
        why) when attempts to reach one have failed, so it fails a first open fast."""
        waited = 0.0
        while not await self._upstream.wait_connected(UPSTREAM_CHECK):
            if self.ending:
                return
            why = self._upstream.unreachable()
            if why is not None:
                log.warning("refusing %s: no broker: %s", self.session_id, why)
                self.refuse(NO_BROKER + why, "no broker")
                return
            waited += UPSTREAM_CHECK
            if waited % self._config.hello_wait < UPSTREAM_CHECK:
                log.warning(
                    "no broker has answered for %g s: %s still waits for its HelloReply",
                    waited,
                    self.session_id,
                )
        if not self.ending:
            self._send_hello_reply()

    def _send_hello_reply(self) -> None:
        upstream = self._upstream
        self.send(hello_reply(self.session_id, upstream.limits, upstream.engine.broker_id))

    # -- requests -----------------------------------------------------------------------

    def on_open(self, request: pb.OpenQueue) -> None:
        """Open the client's handle upstream; answer once the broker has."""
        try:
            check_open(request.uri, request.read, request.write)
        except Invalid as error:
            self.respond(request.request_id, error.status, error.message)
            return
        self.guard.open_queues = len(self._handles)
        # The broker sees the proxy's own token: the proxy checks its clients' (the
        # broker counts the queues an open creates against the client it names).
        refusal = self.guard.check_open(
            parse_queue_uri(request.uri).domain, request.read, request.write, False, self.session_id
        )
        if refusal is not None:
            self.respond(request.request_id, *refusal)
            return
        if request.queue_id in self._handles:
            self.respond(
                request.request_id,
                pb.STATUS_ALREADY_OPEN,
                f"queue_id {request.queue_id} is already open",
            )
            return
        handle = ClientHandle(request.queue_id, request.uri, request.read, request.write)
        self._handles[handle.queue_id] = handle
        opened = self._opens.started(handle.queue_id)
        self._spawn(self._open_upstream(request, handle, opened))

    async def _open_upstream(
        self, request: pb.OpenQueue, handle: ClientHandle, opened: asyncio.Future[None]
    ) -> None:
        try:
            await self._open_upstream_now(request, handle)
        finally:
            self._opens.ended(handle.queue_id, opened)

    async def _open_upstream_now(self, request: pb.OpenQueue, handle: ClientHandle) -> None:
        # Cut to the proxy's own limits: what is pushed waits here until it is read.
        options = self._config.flow_limits(request.options if request.HasField("options") else None)
        try:
            record = await self._upstream.open_queue(
                request.uri,
                read=request.read,
                write=request.write,
                options=options,
                on_message=functools.partial(self._on_push, handle) if request.read else None,
                timeout=self._config.request_timeout,
                # The broker counts the queues this open creates against the client,
                # not against all of the proxy's clients together.
                for_client=self.guard.owner(self.session_id),
            )
        except HoldfastError as error:
            if self._handles.get(handle.queue_id) is handle:
                del self._handles[handle.queue_id]
            self.respond(request.request_id, *relay_status(error))
            return
        if self._handles.get(handle.queue_id) is not handle or self.ending:
            # The client closed it or left while the open was on its way: undo it.
            self._spawn(self._close_upstream(record))
            return
        handle.upstream = record
        self.respond(request.request_id, pb.STATUS_OK, holds_pushes=handle.read)
        early, handle.early = handle.early, []
        for delivery in early:
            self._on_push(handle, delivery)

    def on_configure(self, request: pb.ConfigureQueue) -> None:
        """Reconfigure the client's handle upstream."""
        handle = self._handles.get(request.queue_id)
        if handle is None or handle.upstream is None:
            self.respond_not_open(request.request_id, request.queue_id)
            return
        options = self._config.flow_limits(request.options if request.HasField("options") else None)
        self._spawn(self._configure_upstream(request.request_id, handle.upstream, options))

    async def _configure_upstream(
        self, request_id: int, record: QueueRecord, options: QueueOptions
    ) -> None:
        try:
            await self._upstream.configure_queue(
                record.queue_id, options, self._config.request_timeout
            )
        except HoldfastError as error:
            self.respond(request_id, *relay_status(error))
            return
        self.respond(request_id, pb.STATUS_OK)

    def on_close(self, request: pb.CloseQueue) -> None:
        """Close the client's handle; the upstream handle closes behind it."""
        handle = self._handles.pop(request.queue_id, None)
        if handle is None:
            self.respond_not_open(request.request_id, request.queue_id)
            return
        self.outbox.drop_pushes(handle.queue_id)
        if handle.upstream is None:
            self.respond(request.request_id, pb.STATUS_OK)
        else:
            # Answer after the upstream close: the ACKs of PUTs posted before it come
            # back first, so the client does not report them UNKNOWN.
            self._spawn(self._close_upstream(handle.upstream, request.request_id))

    async def _close_upstream(self, record: QueueRecord, request_id: int | None = None) -> None:
        try:
            await self._upstream.close_queue(record.queue_id, self._config.request_timeout)
        except (HoldfastError, QueueStateError) as error:
            log.debug("closing upstream handle of %s: %s", record.uri, error)
        if request_id is not None:
            self.respond(request_id, pb.STATUS_OK)

    def on_count_consumers(self, request: pb.CountConsumers) -> None:
        """Service discovery: relay the question upstream (client consumers are upstream
        consumers, one each), answer with the broker's count."""
        try:
            domain = parse_queue_uri(request.uri).domain
        except Invalid as error:
            self.count_answer(request.request_id, 0, error.status, error.message)
            return
        refusal = self.guard.check_read(domain)
        if refusal is not None:
            self.count_answer(request.request_id, 0, *refusal)
            return
        self._spawn(self._count_upstream(request))

    async def _count_upstream(self, request: pb.CountConsumers) -> None:
        try:
            count = await self._upstream.count_consumers(request.uri, self._config.request_timeout)
        except HoldfastError as error:
            self.count_answer(request.request_id, 0, *relay_status(error))
            return
        self.count_answer(request.request_id, count)

    # -- messages -----------------------------------------------------------------------

    def on_puts(self, batch: PutColumns) -> None:
        """Post each PUT upstream under the client's GUID (``relay.PutRelay``)."""
        if spans.active():
            self._spans.arrived(batch, self._handles)
        self._counters.puts_relayed += self._relay.relay(batch, self._handles)

    def ack(self, queue_id: int, guid: bytes, status: pb.Status) -> None:
        """Queue an ACK for this client; ACKs routed in one turn of the loop share a frame."""
        self.ack_rows([(queue_id, guid, status)])

    def ack_rows(self, rows: list[AckEntry]) -> None:
        """``ack`` for a run of ACKs of this client at once (``rows`` is the client's now)."""
        if self._spans:
            for _, guid, status in rows:
                self._spans.acked(guid, status)
        if self.ending:
            return
        group = self._acks
        if group is None:
            group = self._acks = AckGroup()
            group.acks = rows
            asyncio.get_running_loop().call_soon(self._flush_acks)
        else:
            group.acks += rows

    def _flush_acks(self) -> None:
        group, self._acks = self._acks, None
        if group is not None and group.acks:
            self._counters.acks.update(map(_status_of, group.acks))
            group.ready = True
            self.outbox.add_acks(group)

    def _on_push(self, handle: ClientHandle, delivery: WirePushes) -> None:
        if self._handles.get(handle.queue_id) is not handle or self.ending:
            return  # the upstream handle is closing; the broker redelivers it
        if handle.upstream is None:
            handle.early.append(delivery)
            return
        pushes, generation = delivery
        record_deliveries(handle.delivered, [push.guid for push in pushes], generation)
        # The broker's PUSHes are pushable as they are: only queue_id and
        # delivery_count are written anew, by the outbox.
        self.outbox.push_rows(handle.queue_id, pushes)

    def on_confirms(self, batch: list[tuple[int, bytes]]) -> None:
        """CONFIRM upstream what this client was delivered on the current upstream link."""
        rejected = self._confirms.confirm(batch)
        self.reject_confirms(rejected, self._confirms.blameless)

    def on_rejects(self, batch: list[RejectRow]) -> None:
        """REJECT upstream, like CONFIRMs: only deliveries of the current upstream link
        (a delay cut to the broker's longest, as the broker would: a client's 2**64-1
        would not fit the upstream frame once made a float and back)."""
        rejected = self._confirms.settle(
            (queue_id, guid, Rejection(requeue, min(delay_ms, MAX_REJECT_DELAY_MS) / 1000))
            for queue_id, guid, requeue, delay_ms in batch
        )
        self.reject_confirms(rejected, self._confirms.blameless)

    def refused_upstream(self, upstream_queue_id: int, guids: list[bytes]) -> bool:
        """The broker refused (UNKNOWN_GUID) CONFIRMs or REJECTs sent on upstream handle
        ``upstream_queue_id``: if it is one of this client's, refuse them under the
        client's handle and return True. They named deliveries this proxy made to the
        client on the current link, so they do not count against its refusal limit."""
        for handle in self._handles.values():
            if handle.upstream is not None and handle.upstream.queue_id == upstream_queue_id:
                self.reject_confirms({(pb.STATUS_UNKNOWN_GUID, handle.queue_id): guids}, len(guids))
                return True
        return False

    # -- the end ------------------------------------------------------------------------

    def on_bytes(self, raw: bytes) -> None:
        """Handle a client frame, knowing its size (``PutRelay.refuses``)."""
        self._frame_bytes = len(raw)
        super().on_bytes(raw)

    def dispatch(self, kind: str, message: Any) -> None:
        """Handle a frame now, or hold it behind an open in flight (``proxy.opening``);
        a PutBatch with no room in the buffer bound is refused whole first."""
        if not self._opens.holds(kind, message):
            self._handle(kind, message, self._frame_bytes)

    def _handle(self, kind: str, message: Any, wire_bytes: int) -> None:
        # A PutBatch is judged against the bound here, not before it is held behind an
        # open: its LIMIT_EXCEEDED ACKs must come after the open's Response.
        if kind == "puts" and self._relay.refuses(message, wire_bytes):
            return
        super().dispatch(kind, message)

    def _handle_held(self, kind: str, message: Any) -> None:
        self._handle(kind, message, message.ByteSize() if kind == "puts" else 0)

    async def wait_before_read(self) -> None:
        """Stop reading this client while frames wait for an open, while the upstream
        pushes back, and while it holds its share of the proxy's buffer bound
        (``holdfast.proxy.budget``)."""
        if self._opens:
            await self._opens.release(self._handle_held, lambda: self.ending)
        await super().wait_before_read()
        await self._upstream.wait_below_high_watermark()
        budget = self._routes.budget
        key = self._route_key
        budget.settled(key)
        if not budget.may_read(key):
            log.info(
                "session %s holds %d bytes of PUTs (its share of --max-buffer-bytes %d "
                "is %d): not reading its frames until some are ACKed",
                self.session_id,
                budget.held(key),
                budget.max_bytes,
                budget.share,
            )
            await budget.wait_for_room(key)
            log.info("session %s: under its buffer share again; reading", self.session_id)

    def on_end(self) -> None:
        """The client left: close its upstream handles so the broker redelivers."""
        self._routes.unregister(self._route_key)
        handles = list(self._handles.values())
        self._handles.clear()
        for handle in handles:
            if handle.upstream is not None:
                self._spawn(self._close_upstream(handle.upstream))
        self._acks = None

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

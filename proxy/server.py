"""The proxy: serves the contract to local applications over one upstream HA session.

Applications connect to the proxy exactly as they would to a broker. Each client
stream is a ``holdfast.proxy.client.ClientSession``; all of them share one
``holdfast.proxy.upstream.Upstream`` (the SDK's session engine) to the first
reachable broker. When the broker goes away the clients stay connected, their
PUTs keep being taken and buffered upstream, and the upstream replays them when
it reconnects; the broker's GUID dedup absorbs the replays.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from holdfast.proto import pb
from holdfast.proto.credentials import bearer_token
from holdfast.proto.limits import FRAME_CEILING
from holdfast.proxy.client import ClientSession
from holdfast.proxy.config import ProxyConfig
from holdfast.proxy.marks import MarkRelay
from holdfast.proxy.routes import ProxyCounters, Routes
from holdfast.proxy.upstream import Upstream
from holdfast.sdk.events import (
    DataLost,
    DeliveriesRevoked,
    HandleConfirmRejected,
    Reconnected,
    SessionEvent,
    log_event,
)
from holdfast.sdk.transports.base import AsyncTransport
from holdfast.server.serve import split_host_port, start_server

if TYPE_CHECKING:
    from holdfast.server.metrics_http import MetricsServer

log = logging.getLogger(__name__)


class Proxy:
    """A Holdfast sidecar proxy: ``await start()``, then ``await stop()``."""

    def __init__(
        self, config: ProxyConfig, upstream_transport: AsyncTransport | None = None
    ) -> None:
        """``upstream_transport`` replaces gRPC upstream (``holdfast.sdk.testing``'s
        in-process broker, in tests)."""
        self.config = config
        self.address = ""
        """``HOST:PORT`` the proxy listens on, with the real port, once started."""
        self.events: list[SessionEvent] = []
        """The upstream session's recent events (connection lost, restored...)."""
        self.routes = Routes(config.max_buffer_bytes)
        self.upstream = Upstream(
            config.upstream_addresses,
            config.upstream_options,
            on_acks=self.routes.on_acks,
            on_event=self._on_event,
            transport=upstream_transport,
        )
        self.routes.relay = self.upstream.engine.relay
        self.routes.relayed = self.upstream.queued
        self.guard = config.security.guard()
        """The proxy's clients' tokens and limits (its own ``--auth-file``)."""
        self.marks = MarkRelay(config.upstream_addresses, config.upstream_options, self.guard)
        """Relays commit mark calls to the brokers (``holdfast.proxy.marks``)."""
        self._sessions: set[ClientSession] = set()
        self._server: Any = None
        self._stopping = False
        self.counters = ProxyCounters()
        """Counters the client sessions and upstream events bump, for the metrics."""
        self.metrics: MetricsServer | None = None
        """The Prometheus endpoint, started if ``config.metrics_port`` is set."""

    @property
    def sessions(self) -> int:
        """How many applications are connected."""
        return len(self._sessions)

    async def start(self) -> str:
        """Start the upstream session, bind, serve; log and return ``HOST:PORT``.
        Raises ``OSError`` if the address cannot be bound; then nothing was started
        and there is nothing to stop. The upstream session starts last, so a proxy
        that cannot listen never dials its brokers."""
        host, _ = split_host_port(self.config.listen)
        # Bound before the broker's limits are known: accept what any broker's may need.
        self._server, port = await start_server(
            self.config.listen,
            FRAME_CEILING,
            self._serve_session,
            self.marks.handle,
            credentials=self.config.security.credentials(),
            serve_staging=self.marks.handle_staging,
        )
        self.address = f"{host}:{port}"
        metrics = self.config.metrics_address
        if metrics is not None:
            # Imported only when asked for: prometheus_client is not loaded otherwise.
            from holdfast.proxy.metrics import ProxyCollector
            from holdfast.server.metrics_http import MetricsServer

            self.metrics = MetricsServer(
                ProxyCollector(
                    self.counters,
                    lambda: len(self._sessions),
                    lambda: self.upstream.engine.connected,
                    lambda: self.upstream.engine.pending_count,
                    self.routes.budget,
                ),
                ready=lambda: not self._stopping and self.upstream.engine.connected,
            )
            try:
                log.info("metrics on %s", self.metrics.start(metrics[1], metrics[0], metrics[2]))
            except OSError:
                await self._server.stop(0)
                self._server = None
                raise
        # No await between the bind and here: no client session runs before it.
        self.upstream.start()
        log.info("listening on %s (upstream %s)", self.address, self.config.upstream)
        return self.address

    async def _serve_session(self, request_iterator: Any, context: Any) -> None:
        if self._stopping:
            error = pb.Error(
                status=pb.STATUS_SHUTTING_DOWN, message="the proxy is stopping", fatal=True
            )
            await context.write(pb.ServerFrame(error=error))
            return
        metadata = getattr(context, "invocation_metadata", None)
        guard = self.guard.session(bearer_token(metadata() if metadata is not None else None))
        session = ClientSession(
            context,
            uuid.uuid4().hex,
            self.config,
            self.upstream,
            self.routes,
            self.counters,
            guard,
        )
        self._sessions.add(session)
        try:
            await session.run()
        except Exception:
            # One client's failure must not reach gRPC's server loop or other clients.
            log.exception("client session %s failed", session.session_id)
        finally:
            self._sessions.discard(session)

    def _on_event(self, event: SessionEvent) -> None:
        self.events = [*self.events[-99:], event]
        if isinstance(event, Reconnected):
            self.counters.reconnects += 1
        elif isinstance(event, DeliveriesRevoked | DataLost):
            self._relay_report(event)
        elif isinstance(event, HandleConfirmRejected):
            self._relay_refusal(event)
        log_event(event)

    def _relay_refusal(self, event: HandleConfirmRejected) -> None:
        """The broker refused CONFIRMs (or REJECTs) the proxy sent for a client (its
        delivery was revoked meanwhile): the client whose upstream handle it was is told,
        as the broker would have told it; no other client is."""
        guids = [guid.bytes for guid in event.guids]
        for session in list(self._sessions):
            if session.refused_upstream(event.queue_id, guids):
                return

    def _relay_report(self, event: DeliveriesRevoked | DataLost) -> None:
        """A broker's report on its store reaches the clients it concerns: revoked
        deliveries each client holds, under its handle; a data loss to every client
        (under each handle on the queue it names, if it names one)."""
        for session in list(self._sessions):
            if isinstance(event, DataLost):
                if event.queue_uri is None:
                    session.error(pb.STATUS_DATA_LOST, event.message)
                for handle in session.handles_on(event.queue_uri or ""):
                    session.error(pb.STATUS_DATA_LOST, event.message, queue_id=handle.queue_id)
                continue
            for handle in session.handles_on(event.queue_uri):
                held = [g.bytes for g in event.guids if g.bytes in handle.delivered]
                if held:
                    session.error(
                        pb.STATUS_DELIVERIES_REVOKED,
                        "the broker node lost its lease on the store: these deliveries are "
                        "void (CONFIRMs refused) and will be delivered again",
                        queue_id=handle.queue_id,
                        guids=held,
                    )

    async def stop(self, grace: float | None = None) -> None:
        """Stop: tell clients SHUTTING_DOWN, give them ``grace`` seconds to receive what
        is queued for them, then close the upstream session."""
        if self._stopping:
            return
        self._stopping = True
        grace = self.config.shutdown_grace if grace is None else grace
        log.info("stopping: %d clients connected", len(self._sessions))
        for session in list(self._sessions):
            session.stop("the proxy is stopping")
        if self._server is not None:
            await self._server.stop(grace)
        await self.upstream.stop()
        await self.marks.close()
        if self.metrics is not None:
            self.metrics.stop()
        log.info("stopped")

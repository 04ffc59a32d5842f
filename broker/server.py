"""The broker: a grpc.aio server and all queue state, on one asyncio event loop.

Every session handler, PUT completion and delivery runs on that one loop, so the
broker's state needs no locks: a piece of code that does not ``await`` sees and
changes the state atomically.

The server is bound by ``holdfast.server.serve.start_server``, which the proxy
shares: sessions receive the raw bytes of each client frame and parse them
themselves, so bytes that are not a ClientFrame get a typed Error(MALFORMED_FRAME)
instead of gRPC failing the stream.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from holdfast.broker import commit_records
from holdfast.broker.admin import AdminBackend, AdminService
from holdfast.broker.admin_local import LocalAdmin
from holdfast.broker.config import BrokerConfig
from holdfast.broker.dedup import BrokerClock
from holdfast.broker.marks import MarkBook, mark_file_for
from holdfast.broker.puts import PutPipeline
from holdfast.broker.redis.losses import DataLoss
from holdfast.broker.redis.spec import redact
from holdfast.broker.registry import SWEEP_INTERVAL, QueueRegistry
from holdfast.broker.session import Session
from holdfast.broker.staging import StagingBook
from holdfast.broker.staging_service import StagingService
from holdfast.broker.store import Store, StoreError
from holdfast.broker.stores import open_store, parse_store_spec
from holdfast.proto import pb
from holdfast.proto.credentials import bearer_token
from holdfast.server.guard import unary_refusal
from holdfast.server.serve import split_host_port, start_server

if TYPE_CHECKING:
    from holdfast.broker.interfaces import MetricsQueues
    from holdfast.broker.queues import Queue
    from holdfast.broker.redis.backend import RedisBackend
    from holdfast.broker.redis.queues import RedisQueue
    from holdfast.server.metrics_http import MetricsServer

log = logging.getLogger(__name__)


class Broker:
    """A Holdfast broker: ``await start()``, then ``await stop()``."""

    def __init__(
        self,
        config: BrokerConfig,
        store: Store | None = None,
        clock: BrokerClock | None = None,
        wall_ms: Callable[[], int] | None = None,
    ) -> None:
        """``clock`` and ``wall_ms`` (the Redis store's shared acceptance times) are
        injected by tests that step time instead of waiting for it."""
        self.config = config
        self.broker_id = uuid.uuid4().hex
        """Identifies this broker process to clients (HelloReply.broker_id)."""
        self.store: Store = (
            store
            if store is not None
            else open_store(
                config.store,
                dedup_window=config.dedup_window,
                dedup_grace=config.dedup_grace,
                sync=config.sync,
            )
        )
        self.clock = BrokerClock() if clock is None else clock
        """The broker's clock (monotonic; resumed from the store's last time at start)."""
        self.queues = QueueRegistry(
            self.store,
            config.dedup_window,
            config.dedup_max_guids,
            self.clock,
            config.dedup_grace,
        )
        self.puts = PutPipeline(
            self.store, self.queues, config.limits, self.clock, config.dedup_grace
        )
        self.redis: RedisBackend | None = None
        """With ``--store redis...``: the queues live in Redis, shared by broker nodes."""
        if parse_store_spec(config.store).kind == "redis":
            from holdfast.broker.redis.backend import RedisBackend

            self.redis = RedisBackend(config, self.broker_id, self._data_lost, wall_ms)
        self.guard = config.security.guard()
        """Tokens and per-session limits (``holdfast.server.guard``)."""
        backend: AdminBackend
        if self.redis is not None:
            from holdfast.broker.redis.admin import RedisAdmin

            backend = RedisAdmin(self.redis.queues)
        else:
            backend = LocalAdmin(self.queues, self.store, self.clock)
        self.admin = AdminService(backend, self.guard)
        """The ``holdfast.v1.Admin`` service the ``holdfast`` command speaks to."""
        self._sweeper: asyncio.Task[None] | None = None
        self.marks = MarkBook()
        """Commit marks of writer applications (``holdfast.broker.marks``); durable from
        ``start()`` on with a sqlite store."""
        self.staging = StagingService(
            StagingBook(self.clock, config.staging),
            lambda: self.marks,
            self.queues,
            self.puts,
            self.guard,
            None if self.redis is None else self.redis.staging,
        )
        """Transactional writes' staged rows (``holdfast.broker.staging_service``)."""
        self.address = ""
        """``HOST:PORT`` the broker listens on, with the real port, once started."""
        self._sessions: set[Session[Queue] | Session[RedisQueue]] = set()
        self._server: Any = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self.metrics: MetricsServer | None = None
        """The Prometheus endpoint, started if ``config.metrics_port`` is set."""

    @property
    def port(self) -> int:
        """The bound port (0 before ``start()``)."""
        return split_host_port(self.address)[1] if self.address else 0

    @property
    def sessions(self) -> int:
        """How many sessions are connected."""
        return len(self._sessions)

    async def start(self) -> str:
        """Recover the store's state, bind, serve; log and return ``HOST:PORT``.
        Raises ``OSError`` if the address cannot be bound, ``StoreError`` if Redis cannot
        be reached."""
        self.recover()
        if self.redis is not None:
            await self.redis.start()
        host, _ = split_host_port(self.config.listen)
        server, port = await start_server(
            self.config.listen,
            self.config.limits.max_frame_bytes,
            self._serve_session,
            self._commit_mark,
            services=[self.admin.handler()],
            serve_staging=self.staging.handle,
            credentials=self.config.security.credentials(),
        )
        self.start_sweeping()
        self._server = server
        self.address = f"{host}:{port}"
        metrics = self.config.metrics_address
        if metrics is not None:
            # Imported only when asked for: prometheus_client is not loaded otherwise.
            from holdfast.broker.metrics import BrokerCollector
            from holdfast.server.metrics_http import MetricsServer

            queues: MetricsQueues = self.queues if self.redis is None else self.redis.queues
            self.metrics = MetricsServer(
                BrokerCollector(
                    queues,
                    self.puts.acks if self.redis is None else self.redis.puts.acks,
                    lambda: len(self._sessions),
                    self.clock,
                    self.staging.book if self.redis is None else self.redis.staging,
                ),
                ready=lambda: self._server is not None and not self._stopping,
            )
            if self.redis is not None:
                from holdfast.broker.redis.metrics import RedisNodeCollector

                self.metrics.registry.register(RedisNodeCollector(self.redis.life))
            try:
                log.info("metrics on %s", self.metrics.start(metrics[1], metrics[0], metrics[2]))
            except OSError:
                await server.stop(0)
                self._server = None
                raise
        log.info(
            "listening on %s (store %s, dedup window %g s, max payload %d bytes)",
            self.address,
            redact(self.config.store),
            self.config.dedup_window,
            self.config.max_payload_bytes,
        )
        return self.address

    def recover(self) -> None:
        """Load what the store (and the commit-mark file) kept, and complete the commits
        a crash cut off before their marks (``commit_records``): ``start()`` does this
        before it binds; an in-process broker (``holdfast.sdk.testing``) calls it alone,
        on its event loop."""
        state = self.store.recover()
        self.clock.resume(state.resume_at)
        self.puts.cover.recovered(state.history_complete_since)
        mark_file = mark_file_for(self.config.store)  # OSError if it cannot be opened
        if mark_file is not None:
            self.marks = MarkBook(mark_file)
            log.info("recovered %d commit marks from %s", len(self.marks), mark_file.path)
            staged = self.staging.open_file(self.config.store)
            if staged:
                log.info("recovered %d staged rows of transactional writes", staged)
        commit_records.complete(state.commits, self.marks, self.staging.book, self.queues.updates)
        messages, guids = self.queues.restore(state)
        if messages or guids:
            log.info("recovered %d messages and %d GUIDs of dedup history", messages, guids)

    def _data_lost(self, loss: DataLoss) -> None:
        """Redis lost data: tell every connected session (an ERROR is logged too), and
        each session with a queue the loss hit, under that queue's handle too."""
        for session in list(self._sessions):
            session.error(pb.STATUS_DATA_LOST, loss.message)
            for uri in loss.queues:
                for queue_id in session.queue_ids(uri):
                    session.error(pb.STATUS_DATA_LOST, loss.message, queue_id=queue_id)

    async def _commit_mark(self, request: pb.CommitMarkRequest, context: Any) -> pb.CommitMarkReply:
        """``CommitMark``, for a token that may write (to record) or read the queue's
        domain."""
        refusal = unary_refusal(self.guard, context, request.queue_uri, request.record)
        if refusal is not None:
            return pb.CommitMarkReply(status=refusal[0], message=refusal[1])
        if self.redis is not None:
            # Marks live in Redis with the staged rows: one history for every node.
            try:
                return await self.redis.marks.handle(request)
            except StoreError as error:
                return pb.CommitMarkReply(status=pb.STATUS_STORE_ERROR, message=str(error)[:500])
        return await self.marks.handle(request, context)

    def start_sweeping(self) -> None:
        """Start the timer that releases delayed messages, applies TTLs and drops idle
        queues (``QueueRegistry.sweep``); idempotent, on the broker's running loop."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        while not self._stopping:
            await asyncio.sleep(SWEEP_INTERVAL)
            try:
                self.queues.sweep()
                if self.redis is None:
                    self.staging.book.sweep()
                else:
                    self.redis.sweep_staging()
            except Exception:
                # A bug in one sweep must not stop TTLs and delays for good.
                log.exception("sweeping the queues failed")

    async def _serve_session(self, request_iterator: Any, context: Any) -> None:
        await self.serve_stream(context)

    async def serve_stream(self, context: Any) -> None:
        """Serve one session stream on ``context`` (a grpc.aio servicer context, or
        anything with its ``peer``, ``read``, ``write``, ``cancelled``, ``set_code`` and
        ``set_details``) until it ends. Runs on the broker's loop."""
        self.start_sweeping()
        if self._stopping:
            error = pb.Error(
                status=pb.STATUS_SHUTTING_DOWN, message="the broker is stopping", fatal=True
            )
            await context.write(pb.ServerFrame(error=error))
            return
        guard = self.guard.session(_token_of(context))
        session: Session[Queue] | Session[RedisQueue]
        if self.redis is None:
            session = Session(
                context,
                uuid.uuid4().hex,
                self.broker_id,
                self.config,
                self.queues,
                self.puts,
                guard,
            )
        else:
            redis = self.redis
            session = Session(
                context,
                uuid.uuid4().hex,
                self.broker_id,
                self.config,
                redis.queues,
                redis.puts,
                guard,
            )
        self._sessions.add(session)
        try:
            await session.run()
        except Exception:
            # One session's failure must not reach gRPC's server loop or other sessions.
            log.exception("session %s failed", session.session_id)
        finally:
            self._sessions.discard(session)

    async def stop(self, grace: float | None = None) -> None:
        """Stop: refuse new sessions, tell connected ones SHUTTING_DOWN (best effort),
        give them ``grace`` seconds (default: the config's) to receive what is queued
        for them, finish PUTs being stored, and close the store."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self.config.shutdown_grace if grace is None else grace
        log.info("stopping: %d sessions connected", len(self._sessions))
        for session in list(self._sessions):
            session.stop()
        try:
            if self._server is not None:
                await self._server.stop(grace)
            await self.staging.drain(max(grace, 1.0))
            await asyncio.wait_for(self.puts.drain(), timeout=max(grace, 1.0))
            await asyncio.wait_for(self.queues.graveyard.wait(), timeout=max(grace, 1.0))
            if self.redis is not None:
                await asyncio.wait_for(self.redis.stop(), timeout=max(grace, 5.0))
            await asyncio.wait_for(self.queues.updates.drain(), timeout=max(grace, 1.0))
        except TimeoutError:
            log.warning("stopping: the store did not finish in time")
        finally:
            if self._sweeper is not None:
                self._sweeper.cancel()
            if self.metrics is not None:
                self.metrics.stop()
            self.store.close()
            self.marks.close()
            self.staging.close()
            self._stopped.set()
            log.info("stopped")


def _token_of(context: Any) -> str | None:
    """The bearer token in a stream's metadata (an in-memory context may have none)."""
    # gRPC's servicer context is untyped here, and the in-memory streams of
    # ``holdfast.sdk.testing`` have no metadata at all: probed, not assumed.
    metadata = getattr(context, "invocation_metadata", None)
    return bearer_token(metadata() if metadata is not None else None)

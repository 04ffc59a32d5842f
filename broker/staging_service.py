"""The broker's ``Staging`` call: stage, commit and abort a transactional write's rows.

The decisions are the ``StagingBook``'s (``holdfast.broker.staging``); this module
serves them. A commit, for one (queue, application, version) at a time:

1. reads the version's commit mark: a version committed before answers OK with
   ``committed_before`` (with other content: CONFLICT), whatever is still staged for it
   is discarded, and nothing is published again, however late the replay;
2. has the book decide (NOT_FOUND if a named attempt's rows are not all staged,
   CONFLICT if two named attempts staged one GUID): nothing is published unless it may
   publish all;
3. publishes the named attempts' rows as one PutBatch through the broker's own PUT
   path, so they go to the store in one write and are enqueued together once durable
   (a consumer sees all of them or none), deduplicated and admitted like any PUT; the
   write carries the commit's record (``commit_records``), so a store that holds the
   rows holds the record that they are this version's, even if the broker dies next;
4. records the commit mark (``MarkBook``), lets the book discard the other attempts,
   and has the store forget the record. A refusal before the mark leaves the rows
   staged and no record: the writer's retry publishes them again and the broker's
   dedup absorbs what made it the first time. A crash before the mark leaves the
   record, and the broker completes the commit at its next start.

A commit or abort, once begun, runs to its end even if its caller gives up (its
deadline passes, its connection drops): the caller's retry or re-run then finds the
mark instead of publishing the rows a second time.

Stores: every one. With a sqlite store staged rows are kept in ``PATH-staging``
(``staging_file``) and survive a restart; with memory they do not, and a commit then
answers NOT_FOUND, which fails the write loudly (Spark runs it again). On a Redis store
the rows, the commit marks and the decisions are Redis's (``holdfast.broker.redis.staging``:
a commit is one script on the queue's slot), shared by every node.

Limits (``StagingLimits``): a stage call that would pass the rows or bytes staged per
(queue, application) or per token is refused whole with LIMIT_EXCEEDED at that call.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from holdfast.broker.commit_records import commit_record
from holdfast.broker.marks import MarkBook
from holdfast.broker.puts import PutPipeline
from holdfast.broker.registry import QueueRegistry
from holdfast.broker.staging import (
    ANONYMOUS_TOKEN,
    AttemptKey,
    CommitOutcome,
    StagedRow,
    StageOutcome,
    StagingBook,
)
from holdfast.broker.staging_file import StagingFile
from holdfast.broker.staging_publish import publish_staged
from holdfast.broker.store import StoreError
from holdfast.broker.stores import parse_store_spec
from holdfast.broker.writer import DERIVED, Writer
from holdfast.proto import pb
from holdfast.proto.credentials import bearer_token
from holdfast.proto.staged_rows import read_staged
from holdfast.proto.validate import Invalid, parse_queue_uri, put_status
from holdfast.server.guard import ServerGuard, unary_refusal

if TYPE_CHECKING:
    from holdfast.broker.redis.staging import RedisStaging

log = logging.getLogger(__name__)


class StagingService:
    """Serves ``Staging`` for a broker: from ``book`` on a memory or sqlite store, from
    ``redis`` on a Redis store."""

    def __init__(
        self,
        book: StagingBook,
        marks: Callable[[], MarkBook],
        queues: QueueRegistry,
        puts: PutPipeline,
        guard: ServerGuard,
        redis: RedisStaging | None = None,
    ) -> None:
        self.book = book
        self._marks = marks
        self._queues = queues
        self._puts = puts
        self._guard = guard
        self.redis = redis
        # Commits and aborts one at a time (they are one per version, and a commit's
        # publishing must not interleave with a retry of itself).
        self._lock = asyncio.Lock()
        self._file: StagingFile | None = None
        self._running: set[asyncio.Future[pb.StagingReply]] = set()

    def open_file(self, store_spec: str) -> int:
        """With a sqlite store, keep staged rows in ``PATH-staging`` (loading what it
        holds); returns the rows restored. Raises ``OSError`` if it cannot be opened."""
        parsed = parse_store_spec(store_spec)
        if parsed.kind != "sqlite":
            return 0
        self._file = StagingFile(parsed.location + "-staging")
        return self.book.restore(self._file, self._file.load())

    def close(self) -> None:
        """Close the staging file, if any."""
        if self._file is not None:
            self._file.close()
            self._file = None

    async def handle(self, request: pb.StagingRequest, context: Any) -> pb.StagingReply:
        """Serve one call, for a token that may write the queue's domain."""
        refusal = unary_refusal(self._guard, context, request.queue_uri, True)
        if refusal is not None:
            return pb.StagingReply(status=refusal[0], message=refusal[1])
        try:
            parse_queue_uri(request.queue_uri)
        except ValueError as error:
            return _invalid(str(error)[:200])
        if not request.app_id or len(request.app_id.encode()) > 1024:
            return _invalid("app_id must be 1 to 1024 bytes")
        action = request.WhichOneof("action")
        if action is None:
            return _invalid("a Staging call needs stage, commit or abort")
        rows: list[StagedRow] = []
        if action == "stage":
            try:
                rows = [StagedRow(*row) for row in read_staged(request.stage)]
            except Invalid as error:
                return pb.StagingReply(status=error.status, message=error.message)
        if action == "stage" and self.redis is None:
            return self._stage(request, rows, context)
        # A commit or abort, once begun, runs to its end whatever becomes of the call:
        # gRPC cancels the handler when the caller's deadline passes, and a commit cut
        # off there, after its rows went to the store but before its mark, left them
        # published and the version unmarked, so a re-run published them again.
        work = asyncio.ensure_future(self._serve(action, request, rows, context))
        self._running.add(work)
        work.add_done_callback(self._ended)
        return await asyncio.shield(work)

    async def _serve(
        self, action: str, request: pb.StagingRequest, rows: list[StagedRow], context: Any
    ) -> pb.StagingReply:
        if self.redis is not None:
            try:
                return await self._on_redis(self.redis, action, request, rows, context)
            except StoreError as error:
                log.error("staging on the Redis store: %s", error)
                return pb.StagingReply(status=pb.STATUS_STORE_ERROR, message=str(error)[:500])
        async with self._lock:
            if action == "abort":
                discarded = self.book.abort(request.queue_uri, request.app_id, request.version)
                return pb.StagingReply(status=pb.STATUS_OK, discarded=discarded)
            return await self._commit(request, self._writer(context))

    def _ended(self, work: asyncio.Future[pb.StagingReply]) -> None:
        """Forget a finished call; log its failure, which a cancelled caller never sees."""
        self._running.discard(work)
        if not work.cancelled() and work.exception() is not None:
            log.error("a Staging call failed", exc_info=work.exception())

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the commits and aborts under way (the
        broker's stop, before the store closes); one still running is left as a kill
        would leave it (a sqlite store's commit record completes it at the next start)."""
        if self._running:
            await asyncio.wait(set(self._running), timeout=timeout)
        if self._running:
            log.warning("stopping: %d Staging calls did not finish in time", len(self._running))

    def _writer(self, context: Any) -> Writer:
        metadata = getattr(context, "invocation_metadata", None)
        return Writer(
            self._guard.session(bearer_token(metadata() if metadata is not None else None)),
            "staging",
        )

    async def _on_redis(
        self,
        redis: RedisStaging,
        action: str,
        request: pb.StagingRequest,
        rows: list[StagedRow],
        context: Any,
    ) -> pb.StagingReply:
        """One call on a Redis store (its scripts are atomic: no lock needed)."""
        uri, app, version = request.queue_uri, request.app_id, request.version
        redirect = redis.registry.policies.effective(uri).redirect
        if redirect is not None and action != "abort":
            # The target's keys are in another slot: no one script could publish there.
            return _invalid(
                f"{uri} redirects to {redirect}: on a Redis store a transactional write "
                "goes to the queue itself; write to the target queue"
            )
        if action == "stage":
            refused = self._invalid_rows(rows) or self._invalid_notices(rows, context, redis)
            if refused is not None:
                return refused
            stage = request.stage
            key = AttemptKey(uri, app, version, stage.partition, stage.attempt)
            outcome = await redis.stage(key, rows, self._token_name(context))
            return self._staged(request, outcome, context)
        if action == "abort":
            return pb.StagingReply(
                status=pb.STATUS_OK, discarded=await redis.abort(uri, app, version)
            )
        commit = request.commit
        attempts = {(a.partition, a.attempt): a.rows for a in commit.attempts}
        return await redis.commit(uri, app, version, attempts, commit.digest, commit.rows)

    def _token_name(self, context: Any) -> str:
        """The name of the token whose budget a stage call counts against."""
        if self._guard.authorizer is None:
            return ANONYMOUS_TOKEN
        metadata = getattr(context, "invocation_metadata", None)
        session = self._guard.session(bearer_token(metadata() if metadata is not None else None))
        return session.grant.name if session.grant is not None else ANONYMOUS_TOKEN

    def _invalid_notices(
        self, rows: list[StagedRow], context: Any, redis: RedisStaging
    ) -> pb.StagingReply | None:
        """A row naming a dead-letter notice queue (or an ``x-original-uri``) its token may
        not write is refused when it is staged (on a Redis store the commit's script
        publishes it unchecked)."""
        writer = self._writer(context)
        for put in rows:
            if not DERIVED.isdisjoint(put.properties):
                status = writer.derived_status(put.properties, redis.registry)
                if status != pb.STATUS_OK:
                    named = {k: v[:100] for k, v in put.properties.items() if k in DERIVED}
                    return pb.StagingReply(
                        status=status,
                        message=f"row {put.guid.hex()[:32]}: a queue it names {named}: "
                        f"{pb.Status.Name(status)}",
                    )
        return None

    def _invalid_rows(self, rows: list[StagedRow]) -> pb.StagingReply | None:
        limits = self._puts.limits
        for put in rows:
            status = put_status(put.guid, put.payload, put.properties, limits)
            if status != pb.STATUS_OK:
                return pb.StagingReply(
                    status=status, message=f"row {put.guid.hex()[:32]}: {pb.Status.Name(status)}"
                )
        return None

    def _stage(
        self, request: pb.StagingRequest, rows: list[StagedRow], context: Any
    ) -> pb.StagingReply:
        refused = self._invalid_rows(rows)
        if refused is not None:
            return refused
        stage = request.stage
        key = AttemptKey(
            request.queue_uri, request.app_id, request.version, stage.partition, stage.attempt
        )
        try:
            outcome = self.book.stage(key, rows, self._token_name(context))
        except (sqlite3.Error, OSError) as error:
            log.error("cannot keep staged rows: %s", error)
            return pb.StagingReply(
                status=pb.STATUS_STORE_ERROR, message=f"cannot keep the staged rows: {error}"
            )
        return self._staged(request, outcome, context)

    def _staged(
        self, request: pb.StagingRequest, outcome: StageOutcome, context: Any
    ) -> pb.StagingReply:
        """The reply to a stage call that got ``outcome``."""
        limits = self.book.limits
        if outcome is StageOutcome.OVER_LIMIT:
            return pb.StagingReply(
                status=pb.STATUS_LIMIT_EXCEEDED,
                message=f"staging limits of {request.app_id[:100]!r} on {request.queue_uri} "
                f"reached ({limits.max_rows} rows, {limits.max_bytes} bytes): commit or abort "
                "versions first",
            )
        if outcome is StageOutcome.OVER_TOKEN_LIMIT:
            return pb.StagingReply(
                status=pb.STATUS_LIMIT_EXCEEDED,
                message=f"staging limits of token {self._token_name(context)!r} reached "
                f"({limits.max_rows_per_token} rows, {limits.max_bytes_per_token} bytes "
                "staged at once over every queue): nothing of this call was staged; commit "
                "or abort versions first",
            )
        if outcome is StageOutcome.OTHER_TOKEN:
            stage = request.stage
            return pb.StagingReply(
                status=pb.STATUS_PERMISSION_DENIED,
                message=f"partition {stage.partition} attempt {stage.attempt} of version "
                f"{request.version} of {request.app_id[:100]!r} was staged by another token: "
                "nothing of this call was staged",
            )
        return pb.StagingReply(
            status=pb.STATUS_OK, committed_before=outcome is StageOutcome.COMMITTED
        )

    async def _commit(self, request: pb.StagingRequest, writer: Writer) -> pb.StagingReply:
        uri, app, version = request.queue_uri, request.app_id, request.version
        commit = request.commit
        marks = self._marks()
        mark = await marks.handle(pb.CommitMarkRequest(queue_uri=uri, app_id=app))
        if mark.found and mark.mark.version >= version:
            self.book.mark_committed(uri, app, mark.mark.version)
            if mark.mark.version == version and mark.mark.digest != commit.digest:
                return pb.StagingReply(
                    status=pb.STATUS_CONFLICT,
                    committed_before=True,
                    message=f"version {version} of {app[:100]!r} on {uri} was committed "
                    f"with other content ({mark.mark.rows} rows; this one has {commit.rows})",
                )
        attempts = {(a.partition, a.attempt): a.rows for a in commit.attempts}
        decided = self.book.prepare(uri, app, version, attempts)
        if decided.outcome is CommitOutcome.ALREADY:
            return pb.StagingReply(
                status=pb.STATUS_OK, committed_before=True, discarded=decided.discarded
            )
        if decided.outcome is CommitOutcome.MISSING:
            return pb.StagingReply(status=pb.STATUS_NOT_FOUND, message=decided.problem)
        if decided.outcome is CommitOutcome.REPEATED_KEYS:
            return pb.StagingReply(status=pb.STATUS_CONFLICT, message=decided.problem)
        record = commit_record(request)
        problem = await publish_staged(self._queues, self._puts, writer, uri, decided.rows, record)
        if problem is not None:
            return problem
        recorded = await marks.handle(
            pb.CommitMarkRequest(
                queue_uri=uri,
                app_id=app,
                record=True,
                version=version,
                digest=commit.digest,
                rows=commit.rows,
            )
        )
        if recorded.status != pb.STATUS_OK:
            return pb.StagingReply(status=recorded.status, message=recorded.message)
        discarded = self.book.finish(uri, app, version, attempts)
        if decided.rows:
            self._queues.updates.forget_commit(record)
        log.info(
            "staging: committed %s version %d on %s: %d rows published, %d discarded",
            app[:100],
            version,
            uri,
            len(decided.rows),
            discarded,
        )
        return pb.StagingReply(
            status=pb.STATUS_OK, published=len(decided.rows), discarded=discarded
        )


def _invalid(message: str) -> pb.StagingReply:
    return pb.StagingReply(status=pb.STATUS_INVALID_ARGUMENT, message=message)

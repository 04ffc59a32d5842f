"""Commit marks on the Redis store (``holdfast.broker.marks``'s rules), kept in
``hf:{uri}:marks`` (application id -> ``<version>|<rows>|<committed ms>|<digest>``) beside
the queue, where a staged commit's script records them too (``staging_scripts``): every
node and every restart sees one history. Marks never expire: a version committed once
stays committed however late a replay comes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from holdfast.broker.marks import Mark, invalid_mark_request, mark_reply
from holdfast.broker.redis.client import RedisClient
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.staging_side_scripts import record_mark
from holdfast.proto import pb

log = logging.getLogger(__name__)


def marks_key(uri: str) -> str:
    """The hash of a queue's commit marks."""
    return QueueKeys(uri).prefix + "marks"


def parse_mark(raw: bytes) -> Mark:
    """A mark as ``RECORD_MARK`` and ``COMMIT_STAGED`` keep it."""
    version, rows, at, digest = raw.split(b"|", 3)
    return Mark(int(version), digest, int(rows), int(at) / 1000)


class RedisMarks:
    """Serves ``CommitMark`` on a broker on the Redis store."""

    def __init__(self, client: RedisClient, now_ms: Callable[[], int]) -> None:
        self._client = client
        self._now_ms = now_ms

    async def handle(self, request: pb.CommitMarkRequest) -> pb.CommitMarkReply:
        """Serve ``CommitMark`` from the marks kept in Redis (``holdfast.broker.marks``'s
        rules), so that every node and every restart sees one history."""
        problem = invalid_mark_request(request)
        if problem is not None:
            return pb.CommitMarkReply(status=pb.STATUS_INVALID_ARGUMENT, message=problem)
        key = marks_key(request.queue_uri)
        redis = self._client.redis
        if not request.record:
            raw = await self._client.call("HGET marks", lambda: redis.hget(key, request.app_id))
            return mark_reply(None if raw is None else parse_mark(raw), request.app_id)
        changed, raw = await self._client.run(
            record_mark(
                key,
                app_id=request.app_id,
                version=request.version,
                digest=request.digest,
                rows=request.rows,
                now_ms=self._now_ms(),
            )
        )
        mark = parse_mark(raw)
        reply = mark_reply(mark, request.app_id)
        if not int(changed) and mark.version == request.version and mark.digest != request.digest:
            reply.status = pb.STATUS_CONFLICT
            reply.message = (
                f"version {request.version} of {request.app_id[:100]!r} on "
                f"{request.queue_uri[:100]} was committed with other content ({mark.rows} "
                f"rows; this one has {request.rows})"
            )
        elif int(changed):
            log.info(
                "commit mark: %s on %s at version %d (%d rows)",
                request.app_id[:100],
                request.queue_uri,
                mark.version,
                mark.rows,
            )
        return reply


__all__ = ["RedisMarks", "marks_key", "parse_mark"]

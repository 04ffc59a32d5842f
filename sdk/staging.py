"""Transactional writes on the client side: the broker's ``Staging`` call.

A writer's tasks stage their rows per attempt (``stage``), invisible to consumers; its
driver then commits the attempts that count (``commit``: published together, the
version's commit mark recorded) or aborts (``abort``). See
``holdfast.broker.staging_service`` for the broker's rules. Every call is idempotent
and retried across the addresses until its deadline (``marks.call_unary``); a broker
that cannot stage (an older one, or a Redis store) raises ``UnsupportedCallError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from holdfast.proto import STAGING_METHOD, pb
from holdfast.sdk.marks import call_unary
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.statuses import commit_mark_error

StagedPut = tuple[bytes, bytes, Mapping[str, str] | None]
"""``(guid, payload, properties)`` of one staged row."""


@dataclass(frozen=True, slots=True)
class Version:
    """Where a transactional write goes: a queue, an application and its version."""

    addresses: Sequence[str]
    queue_uri: str
    app_id: str
    version: int
    timeout: float
    options: SessionOptions | None = None

    def call(self, request: pb.StagingRequest) -> pb.StagingReply:
        """Send one ``Staging`` call; raise the typed error of a refusal."""
        request.queue_uri, request.app_id, request.version = (
            self.queue_uri,
            self.app_id,
            self.version,
        )
        reply: pb.StagingReply = call_unary(
            self.addresses, STAGING_METHOD, request, pb.StagingReply, self.timeout, self.options
        )
        error = commit_mark_error(reply.status, reply.message)
        if error is not None:
            raise error
        return reply


def stage(target: Version, partition: int, attempt: int, rows: Sequence[StagedPut]) -> bool:
    """Stage ``rows`` for one task attempt; False if the version is committed already
    (nothing was staged: the task has nothing to do)."""
    puts = [pb.Put(guid=g, payload=p, properties=props or {}) for g, p, props in rows]
    request = pb.StagingRequest(stage=pb.StageRows(partition=partition, attempt=attempt, rows=puts))
    return not target.call(request).committed_before


def commit(
    target: Version, attempts: Mapping[tuple[int, int], int], digest: bytes, rows: int
) -> pb.StagingReply:
    """Commit the version: publish exactly ``attempts`` ((partition, attempt) -> rows
    staged) and record the mark (``digest``, ``rows``)."""
    staged = [pb.StagedAttempt(partition=p, attempt=a, rows=n) for (p, a), n in attempts.items()]
    request = pb.StagingRequest(commit=pb.CommitStaged(attempts=staged, digest=digest, rows=rows))
    return target.call(request)


def abort(target: Version) -> int:
    """Discard every attempt of the version; returns the rows discarded."""
    return int(target.call(pb.StagingRequest(abort=True)).discarded)

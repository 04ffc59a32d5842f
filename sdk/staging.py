"""Transactional writes on the client side: the broker's ``Staging`` call.

A writer's tasks stage their rows per attempt (``stage``), invisible to consumers; its
driver then commits the attempts that count (``commit``: published together, the
version's commit mark recorded) or aborts (``abort``). See
``holdfast.broker.staging_service`` for the broker's rules. Every call is idempotent
and retried across the addresses until its deadline (``marks.call_unary``); a broker
that cannot stage (an older one) raises ``UnsupportedCallError``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from holdfast.proto import STAGING_METHOD, pb
from holdfast.proto.staged_rows import StagedPut, stage_rows
from holdfast.sdk.marks import Channels, call_unary
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.statuses import commit_mark_error


@dataclass(frozen=True, slots=True)
class Version:
    """Where a transactional write goes: a queue, an application and its version."""

    addresses: Sequence[str]
    queue_uri: str
    app_id: str
    version: int
    timeout: float
    options: SessionOptions | None = None
    channels: Channels | None = None
    """Channels kept open across this target's calls (default: one per call)."""

    def call(self, request: pb.StagingRequest) -> pb.StagingReply:
        """Send one ``Staging`` call; raise the typed error of a refusal."""
        request.queue_uri, request.app_id, request.version = (
            self.queue_uri,
            self.app_id,
            self.version,
        )
        reply: pb.StagingReply = call_unary(
            self.addresses,
            STAGING_METHOD,
            request,
            pb.StagingReply,
            self.timeout,
            self.options,
            self.channels,
        )
        error = commit_mark_error(reply.status, reply.message)
        if error is not None:
            raise error
        return reply


def stage(target: Version, partition: int, attempt: int, rows: Sequence[StagedPut]) -> bool:
    """Stage ``rows`` for one task attempt; False if the version is committed already
    (nothing was staged: the task has nothing to do)."""
    request = pb.StagingRequest(stage=stage_rows(partition, attempt, rows))
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


class Stager:
    """Stages one attempt's rows in chunks with up to ``in_flight`` calls under way, so
    the caller prepares the next chunk while the broker takes the last one."""

    def __init__(self, target: Version, partition: int, attempt: int, in_flight: int = 2) -> None:
        self._target = target
        self._partition = partition
        self._attempt = attempt
        self._in_flight = in_flight
        self._pool = ThreadPoolExecutor(in_flight, thread_name_prefix="holdfast-stage")
        self._pending: deque[Future[bool]] = deque()
        self.open = True
        """False once the broker said the version is committed (staging stops)."""

    def send(self, rows: Sequence[StagedPut]) -> None:
        """Stage ``rows`` (waits while ``in_flight`` calls are under way; raises the
        error of an earlier call that failed)."""
        while len(self._pending) >= self._in_flight:
            self._settle_one()
        if self.open:
            call = self._pool.submit(stage, self._target, self._partition, self._attempt, rows)
            self._pending.append(call)

    def _settle_one(self) -> None:
        if not self._pending.popleft().result():
            self.open = False

    def finish(self) -> bool:
        """Wait for every call; True if every row was staged (the version is open)."""
        try:
            while self._pending:
                self._settle_one()
        finally:
            self.close()
        return self.open

    def close(self) -> None:
        """Stop: calls not started are cancelled."""
        self._pool.shutdown(wait=True, cancel_futures=True)

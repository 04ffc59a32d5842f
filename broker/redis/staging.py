"""Transactional writes on the Redis store: staged rows, commits, aborts and expiry,
shared by every broker node on one Redis (the rules are ``holdfast.broker.staging``'s;
the scripts are ``staging_scripts``; commit marks are ``marks``'s, token budgets
``budgets``').

Keys, all of the queue's hash tag ``{<uri>}`` but the token budgets (``<h>``: a hash of
the application id)::

    hf:{uri}:st:<h>:<version>:<partition>:<attempt>  hash  GUID -> staged row
    hf:{uri}:st:<h>:<version>:idx   hash  "<partition>:<attempt>" -> "<bytes>|<token>"
    hf:{uri}:stusage                hash  r:<h> / b:<h> -> rows / bytes staged, a:<h> -> id
    hf:{uri}:stdue                  zset  attempt key -> its deadline (ms)
    hf:{uri}:marks                  hash  application id -> its commit mark
    hf:stbudget:{<token>}           hash  rows, bytes: what the token has staged
    hf:staged                       set   queues with staged rows (the sweep's list)

A commit is one script on the queue's slot: it checks the mark, the named attempts'
counts and their GUIDs, publishes the rows as PUTs would (dedup history, depth limits),
records the mark and discards the version's other attempts, or does nothing. Every
node sweeps ``hf:staged`` (``sweep``): an attempt past its deadline is discarded there,
logged at WARNING and counted (``expired_rows``, and ``staged-expired`` in the queue's
stats). Staging keys also carry a Redis TTL of twice the retention, refreshed by each
stage call, which only a Redis with no broker node for that long would ever reach. Commit
marks never expire (a version committed once stays committed).

With ``--redis-min-replicas N`` a stage and a commit ``WAIT N``: a stage too few
replicas confirmed fails (the task is retried), a commit is answered UNKNOWN (it is on
the primary; a failover may lose it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from holdfast.broker.dedup import content_digest
from holdfast.broker.redis import durable, staging_scripts
from holdfast.broker.redis.budgets import TokenBudgets
from holdfast.broker.redis.client import RedisClient
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.losses import AckJournal
from holdfast.broker.redis.marks import marks_key, parse_mark
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.script import rows as rows_of
from holdfast.broker.redis.script import text
from holdfast.broker.redis.staging_side_scripts import ExpiredAttempt, expire_staged
from holdfast.broker.staging import AttemptKey, StagedRow, StageOutcome, StagingLimits
from holdfast.broker.store import StoreError
from holdfast.proto import pb
from holdfast.proto.policy import PICKUP_TTL

log = logging.getLogger(__name__)

STAGED_QUEUES = "hf:staged"
"""Queues with staged rows: the list every node's staging sweep walks."""

EXPIRE_BATCH = 256
"""Most attempts one sweep of one queue expires (the next sweep takes more)."""


def app_hash(app_id: str) -> str:
    """The application id's part of a staging key (ids may hold any character)."""
    return hashlib.sha256(app_id.encode()).hexdigest()[:32]


class VersionKeys:
    """The staging keys of one (queue, application, version)."""

    __slots__ = ("app", "due", "index", "marks", "prefix", "queue", "usage")

    def __init__(self, uri: str, app_id: str, version: int) -> None:
        self.queue = QueueKeys(uri)
        self.app = app_hash(app_id)
        self.prefix = f"{self.queue.prefix}st:{self.app}:{version}:"
        """Attempt keys are this and ``<partition>:<attempt>``."""
        self.index = self.prefix + "idx"
        self.usage = self.queue.prefix + "stusage"
        self.due = self.queue.prefix + "stdue"
        self.marks = marks_key(uri)

    def attempt(self, partition: int, attempt: int) -> str:
        """The hash of one attempt's rows."""
        return f"{self.prefix}{partition}:{attempt}"


def row_value(payload: bytes, properties: Mapping[str, str]) -> bytes:
    """A staged row as the scripts keep it (see ``staging_scripts``)."""
    pickup = int(properties[PICKUP_TTL]) if PICKUP_TTL in properties else 0
    header = f"{content_digest(payload, properties)}|{pickup}|"
    header += json.dumps(dict(properties), separators=(",", ":")) if properties else "{}"
    return header.encode() + b"\n" + payload


class RedisStaging:
    """This node's side of transactional writes on the Redis store."""

    def __init__(
        self,
        client: RedisClient,
        registry: RedisRegistry,
        limits: StagingLimits,
        history_ms: int,
        journal: AckJournal | None = None,
    ) -> None:
        self._client = client
        self.registry = registry
        """This node's queues (their policies; dead-letter notice checks)."""
        self.limits = limits
        self._history_ms = history_ms
        self._journal = journal
        self._retention_ms = round(limits.retention * 1000)
        self._ttl_ms = 2 * self._retention_ms
        self.budgets = TokenBudgets(client, limits, self._ttl_ms)
        """The tokens' staging budgets."""
        self.expired_rows = 0
        """Staged rows this node's sweep discarded at their deadline (logged too)."""
        self.discarded_rows = 0
        """Staged rows discarded by this node's commits of other attempts and aborts."""
        self.staged_total = 0
        """Rows staged on the queues the last sweep visited."""

    async def stage(self, key: AttemptKey, rows: Sequence[StagedRow], token: str) -> StageOutcome:
        """Stage ``rows`` (valid PUTs) for one task attempt, for ``token``."""
        keys = VersionKeys(key.queue_uri, key.app_id, key.version)
        batch = {put.guid: put for put in rows}
        size = sum(len(put.payload) for put in batch.values())
        limits = self.limits
        attempt = keys.attempt(key.partition, key.attempt)
        taken: tuple[int, int] | None = (0, 0)
        if batch:
            taken = await self.budgets.take(token, attempt, batch, size)
        if taken is None:
            return StageOutcome.OVER_TOKEN_LIMIT
        call = staging_scripts.stage_rows(
            keys,
            app_id=key.app_id,
            version=key.version,
            partition=key.partition,
            attempt=key.attempt,
            deadline_ms=self.registry.now_ms() + self._retention_ms,
            ttl_ms=self._ttl_ms,
            max_rows=limits.max_rows,
            max_bytes=limits.max_bytes,
            token=token,
            rows=[(guid, row_value(put.payload, put.properties)) for guid, put in batch.items()],
        )
        staged: list[Any] = [b"", 0, 0]
        replicated = True
        try:
            staged, replicated = await self._client.run_replicated(call)
        finally:
            if batch:
                if text(staged[0]) == "STAGED":
                    # The batch may have replaced rows staged before: give back what it
                    # did not add.
                    back = (taken[0] - int(staged[1]), taken[1] - int(staged[2]))
                else:
                    back = taken
                if back != (0, 0):
                    await self.budgets.give(token, *back)
        outcome = text(staged[0])
        if outcome == "COMMITTED":
            return StageOutcome.COMMITTED
        if outcome == "OVER_LIMIT":
            return StageOutcome.OVER_LIMIT
        if outcome == "OTHER_TOKEN":
            return StageOutcome.OTHER_TOKEN
        if not replicated:
            # A failover could lose these rows: the task fails and Spark retries it
            # (its commit would otherwise find them missing, later).
            raise StoreError(
                f"rows staged on the Redis primary, but fewer than {self._client.min_replicas} "
                "replicas confirmed them in time"
            )
        if batch:
            # A queue staged into is a queue (an operator can see and delete it).
            await self.registry.list_queue(key.queue_uri)
            redis = self._client.redis
            await self._client.call("SADD staged", lambda: redis.sadd(STAGED_QUEUES, key.queue_uri))
        return StageOutcome.STAGED

    async def commit(
        self,
        uri: str,
        app_id: str,
        version: int,
        attempts: Mapping[tuple[int, int], int],
        digest: bytes,
        rows: int,
    ) -> pb.StagingReply:
        """Commit ``version``: one ``COMMIT_STAGED`` script (see the module docstring)."""
        registry = self.registry
        policy = registry.policies.effective(uri)
        call = staging_scripts.commit_staged(
            VersionKeys(uri, app_id, version),
            hold=bool(self._client.min_replicas),
            app_id=app_id,
            version=version,
            digest=digest,
            rows=rows,
            now_ms=registry.now_ms(),
            history_ms=self._history_ms,
            max_messages=policy.max_messages or 0,
            max_bytes=policy.max_bytes or 0,
            attempts=attempts,
        )
        await registry.list_queue(uri)
        result, replicated = await self._client.run_replicated(call)
        outcome = text(result[0])
        what = f"version {version} of {app_id[:100]!r} on {uri}"
        if outcome == "ALREADY":
            await self.budgets.give_back(result[2:])
            return pb.StagingReply(
                status=pb.STATUS_OK, committed_before=True, discarded=int(result[1])
            )
        if outcome == "PUBLISHED":
            published, discarded = int(result[1]), int(result[2])
            await self.budgets.give_back(result[3:])
            self.discarded_rows += discarded
            if published:
                if self._journal is not None:
                    self._journal.record(uri, published)
                await durable.published(registry, uri)
            log.info(
                "staging: committed %s: %d rows published, %d discarded",
                what,
                published,
                discarded,
            )
            if not replicated:
                return pb.StagingReply(
                    status=pb.STATUS_UNKNOWN,
                    published=published,
                    discarded=discarded,
                    message=f"{what} was committed on the Redis primary, but fewer than "
                    f"{self._client.min_replicas} replicas confirmed it in time: a failover "
                    "may lose it",
                )
            return pb.StagingReply(status=pb.STATUS_OK, published=published, discarded=discarded)
        return pb.StagingReply(
            status=staging_scripts.STATUS[outcome],
            committed_before=outcome == "CHANGED",
            message=_refusal(outcome, result, what, rows),
        )

    async def abort(self, uri: str, app_id: str, version: int) -> int:
        """Discard every attempt of ``version``; returns the rows discarded."""
        result = await self._client.run(
            staging_scripts.abort_staged(VersionKeys(uri, app_id, version))
        )
        discarded = int(result[0])
        await self.budgets.give_back(result[1:])
        self.discarded_rows += discarded
        return discarded

    async def sweep(self) -> int:
        """Discard the attempts past their deadline on every queue with staged rows
        (logged, counted); returns the rows."""
        client = self._client
        redis = client.redis
        uris = await client.call("SMEMBERS staged", lambda: redis.smembers(STAGED_QUEUES))
        expired = staged = 0
        for raw_uri in uris:
            uri = text(raw_uri)
            queue = QueueKeys(uri)
            due, usage = queue.prefix + "stdue", queue.prefix + "stusage"
            out = await client.run(
                expire_staged(queue, now_ms=self.registry.now_ms(), most=EXPIRE_BATCH)
            )
            for row in rows_of(out, 5):
                gone = ExpiredAttempt(*row)
                expired += int(gone.rows)
                await self.budgets.give_back([gone.token, gone.rows, gone.size])
                _, version, partition, attempt = text(gone.key).rsplit(":st:", 1)[-1].split(":")
                log.warning(
                    "staged rows expired: %d rows of %s application %r version %s partition "
                    "%s attempt %s were never committed within %g s and are discarded",
                    int(gone.rows),
                    uri,
                    text(gone.app)[:100],
                    version,
                    partition,
                    attempt,
                    self.limits.retention,
                )
            if not await client.call("ZCARD", lambda k=due: redis.zcard(k)):  # type: ignore[misc]
                # Taken off the list first, then looked at again: a stage call in
                # between puts it back (it adds after its script), so none is lost.
                await client.call("SREM staged", lambda u=uri: redis.srem(STAGED_QUEUES, u))  # type: ignore[misc]
                if await client.call("ZCARD", lambda k=due: redis.zcard(k)):  # type: ignore[misc]
                    await client.call("SADD staged", lambda u=uri: redis.sadd(STAGED_QUEUES, u))  # type: ignore[misc]
            values = await client.call("HGETALL usage", lambda k=usage: redis.hgetall(k))  # type: ignore[misc]
            staged += sum(int(v) for f, v in values.items() if text(f).startswith("r:"))
        self.expired_rows += expired
        self.staged_total = staged
        return expired


def _refusal(outcome: str, result: Sequence[Any], what: str, rows: int) -> str:
    """The message of a refused commit (nothing of it was published)."""
    if outcome == "MISSING":
        partition, attempt = text(result[1]).split(":")
        return (
            f"partition {partition} attempt {attempt}: {int(result[2])} rows staged, the "
            f"writer reported {int(result[3])} (expired, or lost by the broker)"
        )
    if outcome == "REPEATED":
        return (
            f"{int(result[1])} GUIDs were staged by more than one partition (a key column "
            "value repeated across partitions)"
        )
    if outcome == "CONFLICT":
        return (
            f"{int(result[1])} staged rows of {what} have GUIDs the queue accepted with "
            "other content: nothing was published"
        )
    if outcome == "CHANGED":
        mark = parse_mark(result[1])
        return f"{what} was committed with other content ({mark.rows} rows; this one has {rows})"
    return (
        f"{what}: the queue is full ({int(result[1])} messages, {int(result[2])} bytes): "
        "nothing was published; the commit can be tried again"
    )


__all__ = [
    "EXPIRE_BATCH",
    "STAGED_QUEUES",
    "RedisStaging",
    "VersionKeys",
    "app_hash",
    "row_value",
]

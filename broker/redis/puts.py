"""The PUT path of the Redis store: validate each PUT, then one PUT script per queue
per frame (dedup, depth limits and enqueue, atomic in Redis), then the ACKs in PUT
order. A queue whose policy redirects has its PUTs stored in the target instead.

A PUT is ACKed SUCCESS only once its script returned (and, with
``--redis-min-replicas``, once ``WAIT`` confirmed it; else UNKNOWN); until then it
counts as STORE_ERROR, so nothing that goes wrong can ACK it SUCCESS. STORE_ERROR
promises the PUT was not enqueued (the client may post it again), so it is only given
when no attempt reached Redis. Once one was sent and not answered (a timeout: Redis
stalled, or the link), the script may have run, or may run later: the PUTs are held
and the same call (same arguments) is sent again until Redis answers. The script
deduplicates by GUID, so the answer is the PUTs' true outcome (SUCCESS if the lost
attempt stored them). A PUT still unanswered when it reaches the dedup window's age
(where a client stops vouching for it too) is ACKed UNKNOWN.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from holdfast.broker.consumers import QueueHandle
from holdfast.broker.dedup import HistoryCover, content_digest
from holdfast.broker.redis import put_scripts
from holdfast.broker.redis.client import UnansweredError
from holdfast.broker.redis.durable import promote
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.losses import AckJournal
from holdfast.broker.redis.put_scripts import PUT_REPLAYED, PUT_STORED, PutArgs
from holdfast.broker.redis.queues import RedisQueue
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.script import ScriptCall
from holdfast.broker.store import StoreError
from holdfast.broker.writer import DERIVED, Writer
from holdfast.proto import pb
from holdfast.proto.columns import PutColumns, PutRow
from holdfast.proto.limits import Limits
from holdfast.proto.policy import PICKUP_TTL
from holdfast.proto.validate import put_status
from holdfast.server.outbox import AckGroup, Outbox
from holdfast.server.spans import AcceptSpans

log = logging.getLogger(__name__)

_OK = pb.STATUS_OK


class RedisPutPipeline:
    """PutBatch frames into Redis: one PUT script per queue per frame, then ACKs."""

    def __init__(
        self,
        registry: RedisRegistry,
        limits: Limits,
        retention_ms: int,
        journal: AckJournal | None = None,
    ) -> None:
        self._registry = registry
        self._journal = journal
        self.limits = limits
        self._retention_ms = retention_ms
        grace = max(0.0, retention_ms / 1000 - limits.dedup_window)
        self.cover = HistoryCover(limits.dedup_window, grace)
        """The age past which an unknown GUID is TOO_OLD (``redis.cover``)."""
        self.acks: Counter[int] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    def on_put_batch(
        self,
        puts: PutColumns,
        handles: Mapping[int, QueueHandle[RedisQueue]],
        outbox: Outbox,
        writer: Writer,
        spans: AcceptSpans | None = None,
    ) -> None:
        """Validate, then store each queue's PUTs with one script; ACK in PUT order. A
        dead-letter notice or a redirect is checked against ``writer``'s token now.
        ``spans`` end with the final ACKs."""
        group = AckGroup()
        acks = group.acks
        by_queue: dict[str, list[tuple[int, PutRow]]] = {}
        for put in puts.rows():
            handle = handles.get(put.queue_id)
            if handle is None:
                status = pb.STATUS_UNKNOWN_QUEUE
            elif not handle.write:
                status = pb.STATUS_NOT_WRITABLE
            else:
                status = put_status(put.guid, put.payload, put.properties, self.limits)
                properties = put.properties
                if status == _OK and properties and not DERIVED.isdisjoint(properties):
                    status = writer.derived_status(properties, self._registry)
                if status == _OK:
                    redirect = self._registry.policies.effective(handle.queue.uri).redirect
                    if redirect is not None:
                        status = writer.redirect_status(redirect)
                if status == _OK:
                    by_queue.setdefault(handle.queue.uri, []).append((len(acks), put))
            acks.append((put.queue_id, put.guid, status))
        outbox.add_acks(group)
        if not by_queue:
            self.acks.update(status for _, _, status in acks)
            if spans is not None:
                spans.finished(acks)
            outbox.acks_ready(group)
            return
        task = asyncio.get_running_loop().create_task(self._store(by_queue, group, outbox, spans))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(
        self,
        by_queue: dict[str, list[tuple[int, PutRow]]],
        group: AckGroup,
        outbox: Outbox,
        spans: AcceptSpans | None,
    ) -> None:
        acks = group.acks
        registry = self._registry
        # Until Redis says otherwise, these PUTs are not stored: whatever goes wrong
        # below, none of them is ACKed SUCCESS.
        for items in by_queue.values():
            for index, put in items:
                acks[index] = (put.queue_id, put.guid, pb.STATUS_STORE_ERROR)
        try:
            for uri, items in by_queue.items():
                redirect = registry.policies.effective(uri).redirect

                def unanswered(items: list[tuple[int, PutRow]] = items) -> None:
                    # If this task ends before Redis answers, the ACK must not say
                    # STORE_ERROR: the PUTs may be in the queue.
                    for index, put in items:
                        acks[index] = (put.queue_id, put.guid, pb.STATUS_UNKNOWN)

                statuses = await self._put(redirect or uri, [put for _, put in items], unanswered)
                queue = registry.get(uri)
                stored = 0
                for (index, put), status in zip(items, statuses, strict=True):
                    acks[index] = (put.queue_id, put.guid, status)
                    stored += status == _OK
                if queue is not None:
                    queue.accepted += stored
                if stored and self._journal is not None:
                    self._journal.record(redirect or uri, stored)
        finally:
            self.acks.update(status for _, _, status in acks)
            if spans is not None:
                spans.finished(acks)
            outbox.acks_ready(group)

    async def _put(
        self, uri: str, puts: list[PutRow], unanswered: Callable[[], None] = lambda: None
    ) -> list[pb.Status]:
        registry = self._registry
        policy = registry.policies.effective(uri)
        now = registry.now_ms()
        # Past this the PUTs are older than the dedup window: a client no longer
        # vouches for them either (contract, rule 4).
        max_age_ms = self.cover.max_age_ms(now / 1000)
        hold_until = time.monotonic() + (max_age_ms - max(p.age_ms for p in puts)) / 1000
        latest_pickup = 0
        rows: list[PutArgs] = []
        for row in puts:
            properties = dict(row.properties)
            pickup = 0
            if PICKUP_TTL in properties:
                pickup = now + int(properties[PICKUP_TTL])  # validated by put_status
                latest_pickup = max(latest_pickup, pickup)
            rows.append(
                PutArgs(
                    row.guid,
                    str(content_digest(row.payload, row.properties)),
                    row.age_ms,
                    json.dumps(properties, separators=(",", ":")) if properties else "{}",
                    row.payload,
                    pickup,
                )
            )
        call = put_scripts.put(
            QueueKeys(uri),
            retention_ms=self._retention_ms,
            max_age_ms=max_age_ms,
            now_ms=now,
            max_messages=policy.max_messages or 0,
            max_bytes=policy.max_bytes or 0,
            hold=bool(registry.client.min_replicas),
            puts=rows,
        )
        try:
            await registry.list_queue(uri)
            ran = await self._run(uri, call, hold_until, unanswered)
            if ran is None:
                return [pb.STATUS_UNKNOWN] * len(puts)
            raw, replicated = ran
            reply = put_scripts.put_reply(raw)
            registry.seqs.saw(uri, reply.seq)
        except StoreError as error:
            log.error("%s: %d PUTs not stored: %s", uri, len(puts), error)
            return [pb.STATUS_STORE_ERROR] * len(puts)
        if registry.client.min_replicas:
            replicated = await self._after_wait(uri, puts, reply.outcomes, replicated)
        statuses: list[pb.Status] = []
        for code in reply.outcomes:
            if code in (PUT_STORED, PUT_REPLAYED):
                statuses.append(_OK if replicated else pb.STATUS_UNKNOWN)
            else:
                statuses.append(put_scripts.refusal_status(code))  # CONFLICT, TOO_OLD, QUEUE_FULL
        if latest_pickup:
            registry.timed[uri] = max(registry.timed.get(uri, 0), latest_pickup)
        if reply.consumed and _OK in statuses:
            # A node with no consumers does nothing with a wake, yet every node's
            # subscriber reads each one: with nobody consuming (producers ahead of
            # consumers) a PUBLISH per frame cost each of two nodes more than its own
            # PUTs did (bench/redisscale.py). A consumer that attaches claims at once;
            # what lands between that claim and its count reaching Redis
            # (``consumers_changed``) waits for the node's poll (``nodes.POLL``).
            registry.wake(uri)
        return statuses

    async def _run(
        self, uri: str, call: ScriptCall, hold_until: float, unanswered: Callable[[], None]
    ) -> tuple[Any, bool] | None:
        """``run_replicated``; if an attempt reached Redis unanswered, the same call
        again until Redis answers (``None`` if it has not by ``hold_until``). A
        ``StoreError`` means no attempt reached Redis."""
        client = self._registry.client
        try:
            return await client.run_replicated(call)
        except UnansweredError as error:
            unanswered()
            log.warning(
                "%s: a PUT script sent to Redis got no reply (%s); sending it again until"
                " Redis answers, for up to %.0f s",
                *(uri, error, max(0.0, hold_until - time.monotonic())),
            )
        try:
            return await client.run_replicated(call, deadline=hold_until, unanswered=True)
        except StoreError as error:  # UnansweredError: the first attempt may have run
            log.error("%s: PUTs ACKed UNKNOWN, Redis never answered: %s", uri, error)
            return None

    async def _after_wait(
        self, uri: str, puts: list[PutRow], raw: list[int], replicated: bool
    ) -> bool:
        """With ``--redis-min-replicas``: messages replicas confirmed become deliverable;
        the others wait for a later check (``durable``). Returns whether the PUTs may be
        ACKed SUCCESS."""
        stored = [put.guid for put, code in zip(puts, raw, strict=True) if code == PUT_STORED]
        if replicated and stored:
            try:
                await promote(self._registry, uri, stored[-1])
            except StoreError as error:  # stored and replicated: a later check promotes
                log.warning("%s: promoting %d messages: %s", uri, len(stored), error)
        if not replicated or len(stored) < len(puts):
            # Too few replicas, or a replay of a message that may still wait.
            self._registry.unsynced.add(uri)
        return replicated

    async def drain(self) -> None:
        """Wait until every PUT batch in progress has finished."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    @property
    def in_progress(self) -> int:
        """PUT batches waiting for Redis."""
        return len(self._tasks)


__all__ = ["RedisPutPipeline"]

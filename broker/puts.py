"""The PUT path: validate, deduplicate, store, enqueue, ACK.

Per PutBatch frame (its columns, read once: ``holdfast.proto.columns``):

1. every PUT is validated on its own; an invalid one gets an ACK with its typed
   status and the rest of the batch carries on;
2. a valid PUT whose GUID the queue knows (its message is still queued or
   unconfirmed, or the history holds it) is a replay: ACKed OK and not enqueued
   again if its content digest matches the original's, else ACKed CONFLICT;
3. a valid PUT whose GUID is *in flight* (accepted, store write still pending: a
   retransmit racing its original, or the same GUID twice in one batch) is a replay
   too, but its ACK waits for the original's outcome: OK once it is durable,
   STORE_ERROR if that write failed (CONFLICT at once if the digest differs);
4. a PUT of an unknown GUID whose ``age_ms`` is past the announced window is ACKed
   TOO_OLD: the history may have forgotten an earlier copy, so the broker cannot
   vouch for it (see ``dedup`` for the grace that covers time in flight);
5. a new PUT to a queue at its depth limit (``QueuePolicy.max_messages`` or
   ``max_bytes``) is ACKed QUEUE_FULL, and one while the broker-wide history bound
   is reached HISTORY_FULL: the SDK keeps either and retries later (GUIDs are never
   evicted early, and nothing is dropped);
6. a PUT to a queue whose policy redirects (``QueuePolicy.redirect``) is all of the
   above against the target queue instead: one hop, deduplicated there;
7. the new messages of the frame go to the store in one ``write()``; once it is
   durable they are enqueued, recorded in the history and ACKed OK. A frame that
   publishes a transactional write's commit (``staging_service``) carries its
   ``CommitRecord`` in that write, also with no new message, but only if every one of
   its PUTs is OK at once (new, or a replay of a stored message): a version published
   in part is never recorded as committed.

Every PUT gets exactly one ACK, also when one frame carries the same GUID twice.

The frame's ACKs leave in PUT order, once all of them are final (see ``outbox``).
This loop runs for every message at up to ~100k msg/s, so it does as little as it
can per PUT: no per-message futures, tasks or awaits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from operator import itemgetter

from holdfast.broker.accept import accept
from holdfast.broker.dedup import DEFAULT_GRACE, HistoryCover, content_digest
from holdfast.broker.lifecycle import Admission, admit
from holdfast.broker.queues import Queue, QueueHandle
from holdfast.broker.registry import QueueRegistry
from holdfast.broker.store import (
    NO_PROPERTIES,
    CommitRecord,
    Completed,
    Store,
    StoreBatch,
    StoredMessage,
)
from holdfast.broker.writer import DERIVED, Writer
from holdfast.proto import pb
from holdfast.proto.columns import PutColumns
from holdfast.proto.limits import Limits
from holdfast.proto.validate import put_status
from holdfast.server.outbox import AckEntry, AckGroup, Outbox
from holdfast.server.spans import AcceptSpans

log = logging.getLogger(__name__)

_OK = pb.STATUS_OK
_status_of = itemgetter(2)
"""The status of an ``AckEntry``."""
_STORE_ERROR = pb.STATUS_STORE_ERROR
_CONFLICT = pb.STATUS_CONFLICT
_ACCEPT = Admission.ACCEPT
_HISTORY_FULL = Admission.HISTORY_FULL
_STATUS_OF: dict[Admission, pb.Status] = {
    Admission.ACCEPT: pb.STATUS_OK,
    Admission.DUPLICATE: pb.STATUS_OK,
    Admission.CONFLICT: pb.STATUS_CONFLICT,
    Admission.TOO_OLD: pb.STATUS_TOO_OLD,
    Admission.QUEUE_FULL: pb.STATUS_QUEUE_FULL,
    Admission.HISTORY_FULL: pb.STATUS_HISTORY_FULL,
}
"""The ACK status of each of the lifecycle's answers to a PUT."""


class PutPipeline:
    """Turns PutBatch frames into stored, enqueued, ACKed messages."""

    def __init__(
        self,
        store: Store,
        queues: QueueRegistry,
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
        grace: float = DEFAULT_GRACE,
    ) -> None:
        self._store = store
        self._queues = queues
        self.limits = limits
        """What every PUT is checked against (``holdfast.proto.validate.put_status``)."""
        self._clock = clock
        self.cover = HistoryCover(limits.dedup_window, grace)
        """The age past which a PUT of an unknown GUID is TOO_OLD: the window, or less
        after a restart on a history pruned under a shorter one."""
        self._budget = queues.budget
        self._tasks: set[asyncio.Task[None]] = set()
        self.acks: Counter[int] = Counter()
        """ACKs made final, by status (read by the metrics collector)."""

    def on_put_batch(
        self,
        puts: PutColumns,
        handles: Mapping[int, QueueHandle[Queue]],
        outbox: Outbox,
        writer: Writer,
        spans: AcceptSpans | None = None,
        commit: CommitRecord | None = None,
    ) -> None:
        """Handle one PutBatch frame of a session whose open queues are ``handles``; its
        ACKs go to ``outbox``, in PUT order, once they are final. What the broker would
        write elsewhere for these PUTs (a redirect, a dead-letter notice) is checked
        against ``writer``'s token now. ``spans`` end with the final ACKs. ``commit``
        goes to the store with the frame's messages if all of its PUTs are OK."""
        group = AckGroup()
        acks = group.acks
        fresh: list[StoredMessage] = []
        fresh_queues: list[Queue] = []
        # ACK positions whose status follows this frame's own store write.
        own: list[int] = []
        # ACK positions whose status follows another frame's store write.
        waits: list[tuple[int, asyncio.Future[bool]]] = []
        written: asyncio.Future[bool] | None = None
        now = self._clock()
        limits = self.limits
        last_id = -1
        handle: QueueHandle[Queue] | None = None
        last_queue: Queue | None = None
        target: Queue = None  # type: ignore[assignment]  # set with last_queue
        depth_limited = False
        redirect_status = _OK
        max_age = self.cover.max_age_ms(now)
        budget = self._budget
        # The batch's columns, read once (``holdfast.proto.columns``); properties are
        # looked up only for the PUTs that have them.
        all_properties = puts.properties
        no_properties: Mapping[str, str] = NO_PROPERTIES
        for index, (queue_id, guid, payload, age_ms) in enumerate(
            zip(puts.queue_ids, puts.guids, puts.payloads, puts.ages_ms, strict=True)
        ):
            if queue_id != last_id:
                handle = handles.get(queue_id)
                last_id = queue_id
            if handle is None:
                status = pb.STATUS_UNKNOWN_QUEUE
            elif not handle.write:
                status = pb.STATUS_NOT_WRITABLE
            else:
                properties = (
                    all_properties.get(index, no_properties) if all_properties else no_properties
                )
                status = put_status(guid, payload, properties, limits)
                if status == _OK and properties and not DERIVED.isdisjoint(properties):
                    status = writer.derived_status(properties, self._queues)
                if status == _OK:
                    queue = handle.queue
                    if queue is not last_queue:
                        last_queue = queue
                        target = queue
                        redirect_status = _OK
                        if queue.policy.redirect is not None:
                            redirect_status = writer.redirect_status(queue.policy.redirect)
                            if redirect_status == _OK:
                                target = self._queues.open(queue.policy.redirect)
                        target.history.expire(now)
                        depth_limited = target.policy.limits_depth
                    queue = target
                    status = redirect_status
                if status == _OK:
                    digest = content_digest(payload, properties)
                    pending = queue.in_flight.get(guid)
                    if pending is not None:
                        if pending[1] != digest:
                            status = _CONFLICT
                        elif pending[0] is written:
                            queue.dedup_hits += 1
                            own.append(len(acks))
                        else:
                            queue.dedup_hits += 1
                            waits.append((len(acks), pending[0]))
                    elif (
                        verdict := admit(
                            queue.live.known_digest(guid, now),
                            digest,
                            age_ms,
                            max_age,
                            depth_limited and queue.full(1, len(payload)),
                            budget.full(),
                        )
                    ) is not _ACCEPT and (
                        # Full by the count: expire every history first, and look again.
                        verdict is not _HISTORY_FULL or self._still_full(now)
                    ):
                        status = _STATUS_OF[verdict]
                        if status == _OK:
                            queue.dedup_hits += 1
                    else:
                        if written is None:
                            written = asyncio.get_running_loop().create_future()
                        queue.in_flight[guid] = (written, digest)
                        queue.in_flight_bytes += len(payload)
                        budget.reserved += 1
                        own.append(len(acks))
                        fresh.append(
                            StoredMessage(
                                queue.uri,
                                guid,
                                payload,
                                # The batch's own dict (``PutColumns.properties``): kept.
                                properties or NO_PROPERTIES,
                                now,
                                0,
                                digest,
                            )
                        )
                        fresh_queues.append(queue)
            acks.append((queue_id, guid, status))
        outbox.add_acks(group)
        if commit is not None and (waits or any(status != _OK for _, _, status in acks)):
            # A PUT refused, or waiting on another frame's write that may still fail.
            commit = None
        if written is None and not waits and commit is None:
            self._release(group, outbox, spans)
            return
        result: Awaitable[None] | None = None
        if written is not None or commit is not None:
            # Taken by the store now, so stores see batches in the order frames were read.
            try:
                result = self._store.write(StoreBatch(messages=fresh, commit=commit))
            except Exception as error:
                result = _raise(error)
        if not waits and isinstance(result, Completed):
            # The store finished the write at once (the memory store): ACK now rather
            # than a loop turn later in a task of its own. Through one broker, a frame of
            # one PUT took 7 turns of the loop from read to ACK written.
            try:
                self._settle(True, written, fresh, fresh_queues, own, acks)
            except Exception:
                self._abandon(written, fresh, fresh_queues, own, acks)
                log.exception("a PUT batch failed; its PUTs are ACKed STORE_ERROR")
            finally:
                self._release(group, outbox, spans)
            return
        task = asyncio.get_running_loop().create_task(
            self._finish(result, written, fresh, fresh_queues, own, waits, group, outbox, spans)
        )
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _still_full(self, now: float) -> bool:
        """Expire every queue's history (idle queues expire only here) and say whether
        the bound is still reached."""
        for queue in self._queues:
            queue.history.expire(now)
        return self._budget.full()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("a PUT batch failed; its PUTs are ACKed STORE_ERROR", exc_info=error)

    async def _finish(
        self,
        result: Awaitable[None] | None,
        written: asyncio.Future[bool] | None,
        fresh: list[StoredMessage],
        fresh_queues: list[Queue],
        own: list[int],
        waits: list[tuple[int, asyncio.Future[bool]]],
        group: AckGroup,
        outbox: Outbox,
        spans: AcceptSpans | None,
    ) -> None:
        """Wait for the store, then enqueue, record and make the ACKs final."""
        acks = group.acks
        try:
            if result is not None:
                durable = await self._settle_write(result, len(fresh))
                self._settle(durable, written, fresh, fresh_queues, own, acks)
            for index, original in waits:
                if not await original:
                    queue_id, guid, _ = acks[index]
                    acks[index] = (queue_id, guid, _STORE_ERROR)
        except BaseException:
            self._abandon(written, fresh, fresh_queues, [*own, *(i for i, _ in waits)], acks)
            raise
        finally:
            self._release(group, outbox, spans)

    def _settle(
        self,
        durable: bool,
        written: asyncio.Future[bool] | None,
        fresh: list[StoredMessage],
        fresh_queues: list[Queue],
        own: list[int],
        acks: list[AckEntry],
    ) -> None:
        """The store's outcome for the frame's write: its new messages join their
        queues (durable), replays waiting on them learn it, and what was not kept fails."""
        if written is not None:
            accept(fresh, fresh_queues, durable)
            # After accept: if it fails, ``_abandon`` gives the reservation back, once.
            self._budget.reserved -= len(fresh)
            # Replays waiting on this write (on any session) learn its outcome.
            written.set_result(durable)
        if not durable:
            # Without new messages the write carried only a commit record: the
            # commit is not recorded, so none of its PUTs may count as done.
            _mark_failed(acks, own if written is not None else range(len(acks)))

    def _abandon(
        self,
        written: asyncio.Future[bool] | None,
        fresh: list[StoredMessage],
        fresh_queues: list[Queue],
        positions: Iterable[int],
        acks: list[AckEntry],
    ) -> None:
        """Something failed before the write's outcome was settled: never leave a replay
        waiting forever on a write that will not report; the PUTs at ``positions`` fail."""
        if written is not None and not written.done():
            for message, queue in zip(fresh, fresh_queues, strict=True):
                if queue.in_flight.pop(message.guid, None) is not None:
                    queue.in_flight_bytes -= len(message.payload)
            self._budget.reserved -= len(fresh)
            written.set_result(False)
        _mark_failed(acks, positions)

    def _release(self, group: AckGroup, outbox: Outbox, spans: AcceptSpans | None) -> None:
        """The frame's ACKs are final: count them, end their spans, let them leave."""
        acks = group.acks
        self.acks.update(map(_status_of, acks))
        if spans is not None:
            spans.finished(acks)
        outbox.acks_ready(group)

    async def _settle_write(self, result: Awaitable[None], count: int) -> bool:
        try:
            await result
        except Exception:
            log.exception(
                "the store failed to write %d messages; they are ACKed STORE_ERROR", count
            )
            return False
        return True

    async def quiet(self, queue: Queue, guids: Iterable[bytes]) -> None:
        """Return once none of ``guids`` is in flight (its store write pending) in
        ``queue`` or the queue it redirects to, so that a frame handled right after
        finds each either stored or unknown, none waiting on another frame's write."""
        guids = list(guids)
        while True:
            queues = [queue]
            if queue.policy.redirect is not None:
                target = self._queues.get(queue.policy.redirect)
                if target is not None:
                    queues.append(target)
            pending = {
                found[0]
                for each in queues
                if each.in_flight
                for guid in guids
                if (found := each.in_flight.get(guid)) is not None
            }
            if not pending:
                return
            await asyncio.wait(pending)

    async def drain(self) -> None:
        """Wait until every PUT batch in progress has finished."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    @property
    def in_progress(self) -> int:
        """How many PUT batches wait for the store or for an original's outcome."""
        return len(self._tasks)


async def _raise(error: Exception) -> None:
    raise error


def _mark_failed(acks: list[AckEntry], positions: Iterable[int]) -> None:
    for index in positions:
        queue_id, guid, _ = acks[index]
        acks[index] = (queue_id, guid, _STORE_ERROR)

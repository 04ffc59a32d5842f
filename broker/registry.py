"""All queues of a broker, by URI: created on first use, dropped when idle, deleted
and purged by operators, and swept on a timer.

An unused queue costs nothing once it is idle: no handle, no message, no policy and a
GUID history that has expired. It cannot be dropped sooner, because its history must
outlive its handles for as long as the dedup window says a replay may still come.
``sweep()`` (every ``SWEEP_INTERVAL`` seconds, from the broker) releases messages
whose reject delay is over, dead-letters ready messages past their TTL and drops
idle queues.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from holdfast.broker.deadletter import Graveyard
from holdfast.broker.dedup import (
    DEFAULT_GRACE,
    DEFAULT_WINDOW,
    GuidHistory,
    HistoryBudget,
    default_max_guids,
)
from holdfast.broker.queues import Queue
from holdfast.broker.store import MessageKey, RecoveredState, Store, StoreBatch
from holdfast.broker.updates import Updates
from holdfast.proto import pb
from holdfast.proto.policy import NO_POLICY, QueuePolicy, is_template, template_matches
from holdfast.proto.validate import Invalid

SWEEP_INTERVAL = 0.1
"""Seconds between sweeps: the granularity of reject delays and TTLs."""

IDLE_SCAN_INTERVAL = 5.0
"""Seconds between looks for idle queues to drop (a look visits every queue)."""


class QueueRegistry:
    """All queues of the broker, by URI, created on first use."""

    def __init__(
        self,
        store: Store,
        dedup_window: float = DEFAULT_WINDOW,
        dedup_max_guids: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        dedup_grace: float = DEFAULT_GRACE,
    ) -> None:
        self._queues: dict[str, Queue] = {}
        self._dedup_window = dedup_window
        self._dedup_grace = dedup_grace
        self.budget = HistoryBudget(
            default_max_guids() if dedup_max_guids is None else dedup_max_guids
        )
        """The GUIDs all queues' histories hold, against the broker's bound."""
        self._clock = clock
        self._store = store
        self.updates = Updates(store)
        self.graveyard = Graveyard(store, self.open, clock)
        """Moves dead messages to dead-letter queues (``deadletter``)."""
        self.dropped_idle = 0
        """Idle queues dropped (metrics)."""
        self.templates: dict[str, QueuePolicy] = {}
        """Policy templates (``hf://<domain>/<prefix>*``): the policy of every queue they
        cover that has none of its own."""
        self.timed: set[Queue] = set()
        """Queues with delayed messages or a TTL: the ones ``sweep()`` visits each time."""
        self._next_idle_scan = clock() + IDLE_SCAN_INTERVAL

    def now(self) -> float:
        """The broker's clock, the one ``accepted_at`` times are on."""
        return self._clock()

    def __iter__(self) -> Iterator[Queue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def get(self, uri: str) -> Queue | None:
        """The queue at ``uri`` if it exists."""
        return self._queues.get(uri)

    def open(self, uri: str) -> Queue:
        """The queue at ``uri``, created empty if it does not exist yet."""
        queue = self._queues.get(uri)
        if queue is None:
            history = GuidHistory(
                self._dedup_window, self._dedup_grace, self.budget, self._clock, uri
            )
            queue = self._queues[uri] = Queue(
                uri, history, self.updates, self.graveyard, self._clock, self.timed
            )
            if self.templates:
                self._inherit(queue)
        return queue

    def count_consumers(self, uri: str, answer: Callable[[int], None]) -> None:
        """Answer at once with the consumers of ``uri`` (0 for a queue never opened):
        this broker holds every consumer of its queues."""
        queue = self._queues.get(uri)
        answer(0 if queue is None else len(queue.consumers))

    def policy_of(self, uri: str) -> QueuePolicy | None:
        """The policy in force at ``uri`` (a queue or a template), None if unknown."""
        if is_template(uri):
            return self.templates.get(uri)
        queue = self._queues.get(uri)
        return None if queue is None else queue.policy

    def _template_for(self, uri: str) -> QueuePolicy:
        """The policy of the longest template covering ``uri`` (``NO_POLICY`` if none)."""
        best, found = -1, NO_POLICY
        for template, policy in self.templates.items():
            if len(template) > best and template_matches(template, uri):
                best, found = len(template), policy
        return found

    def _inherit(self, queue: Queue) -> None:
        """Give a queue without a policy of its own its template's."""
        if not queue.own_policy:
            queue.policy = self._template_for(queue.uri)
            self._policy_changed(queue)

    def _policy_changed(self, queue: Queue) -> None:
        if queue.policy.ttl is not None:
            self.timed.add(queue)
        # New limits apply at once: what is past them now goes, and delivery resumes.
        queue.expire(self._clock())
        queue.deliver()

    def restore(self, state: RecoveredState) -> tuple[int, int]:
        """Load what a store recovered: ready messages (in order), GUID history and
        policies. Returns (messages, history entries kept)."""
        messages = 0
        for uri, ready in state.queues.items():
            self.open(uri).enqueue(ready)
            messages += len(ready)
        kept = 0
        for entry in state.history:
            queue = self.open(entry.queue_uri)
            queue.history.record(entry.guid, entry.digest, entry.accepted_at)
            kept += entry.guid in queue.history
        for uri, policy in state.policies.items():
            if is_template(uri):
                self.templates[uri] = policy
                continue
            queue = self.open(uri)
            queue.policy, queue.own_policy = policy, True
            if policy.ttl is not None:
                self.timed.add(queue)
        for queue in self._queues.values():
            if not queue.own_policy:
                queue.policy = self._template_for(queue.uri)
        return messages, kept

    def set_policy(self, uri: str, policy: QueuePolicy) -> StoreBatch:
        """Set (or with ``NO_POLICY`` clear) the policy of the queue or template ``uri``;
        a queue whose own policy is cleared falls back to its template's. Returns the
        store batch that makes it durable. Raises ``Invalid`` for a policy that cannot
        work."""
        policy.check_for(uri)
        if policy.empty:
            policy = NO_POLICY
        if is_template(uri):
            if policy is NO_POLICY:
                self.templates.pop(uri, None)
            else:
                self.templates[uri] = policy
            for queue in self._queues.values():
                if template_matches(uri, queue.uri):
                    self._inherit(queue)
            return StoreBatch(policies=[(uri, policy)])
        queue = self.open(uri)
        queue.own_policy = policy is not NO_POLICY
        queue.policy = policy if queue.own_policy else self._template_for(uri)
        self._policy_changed(queue)
        return StoreBatch(policies=[(uri, policy)])

    def purge(self, uri: str) -> tuple[int, StoreBatch]:
        """Remove the ready and delayed messages of ``uri``; consumers keep what they
        hold unconfirmed. Returns how many went and the store batch to write."""
        queue = self._require(uri)
        purged = queue.purge()
        return len(purged), StoreBatch(removed=[MessageKey(uri, m.guid) for m in purged])

    def delete(self, uri: str) -> tuple[int, StoreBatch]:
        """Delete ``uri`` with its messages, history and policy. Refused with
        ``QUEUE_IN_USE`` while any session has it open (or a PUT to it is in flight):
        close the handles first. Returns how many messages went and the batch."""
        queue = self._require(uri)
        if queue.handles or queue.in_flight:
            raise Invalid(
                pb.STATUS_QUEUE_IN_USE,
                f"{uri} has {queue.handles} open handles and {len(queue.in_flight)} PUTs "
                "in flight; close them before deleting it",
            )
        del self._queues[uri]
        self.timed.discard(queue)
        count = len(queue.live)
        queue.purge()
        queue.live.clear()
        queue.live_bytes = 0
        queue.history.clear()
        return count, StoreBatch(deleted=[uri])

    def sweep(self) -> None:
        """Release due delayed messages, expire ready ones past their TTL and, every
        ``IDLE_SCAN_INTERVAL``, drop idle queues whose history has expired."""
        now = self._clock()
        for queue in list(self.timed):
            if queue.delayed:
                queue.release_due(now)
            if queue.pickups:
                queue.expire_pickups(now)
            if queue.policy.ttl is not None:
                if queue.ready:
                    queue.expire(now)
            elif not queue.delayed and not queue.pickups:
                self.timed.discard(queue)
        if now >= self._next_idle_scan:
            self._next_idle_scan = now + IDLE_SCAN_INTERVAL
            self.drop_idle(now)

    def drop_idle(self, now: float) -> int:
        """Drop every idle queue whose history has expired; returns how many."""
        idle: list[str] = []
        for uri, queue in self._queues.items():
            if queue.idle:
                queue.history.expire(now)
                if not len(queue.history):
                    idle.append(uri)
        for uri in idle:
            self.timed.discard(self._queues.pop(uri))
        self.dropped_idle += len(idle)
        return len(idle)

    def _require(self, uri: str) -> Queue:
        queue = self._queues.get(uri)
        if queue is None:
            raise Invalid(pb.STATUS_NOT_FOUND, f"no queue {uri} on this broker")
        return queue


__all__ = ["IDLE_SCAN_INTERVAL", "SWEEP_INTERVAL", "QueueRegistry"]

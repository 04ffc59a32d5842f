"""The orphan processor: requests the broker redirected because their key had no
bound queue.

For each orphan, on a thread of its own (the SDK's callback thread is never held):
read its key (``x-rpc-key``); ask the tracker to activate the key; wait until the
queue loop has bound the key's queue for that activation; then, under the key's
lock (so the queue cannot be unbound meanwhile), forward the request to the key
queue under its own GUID, payload and properties, wait for the broker's ACK, and only
then confirm the orphan. A forward that repeats (the manager died after the ACK and
before the confirm) is absorbed by the broker's dedup; a request arriving while its
key is being unbound is redirected again and comes back here: never lost.

An orphan without a valid key is rejected without requeue: the orphan queue's
policy dead-letters it to the pool's poison queue, and the broker tells its caller
(``x-dead-letter-notify``). One that cannot be forwarded now is rejected with requeue
after a delay; the orphan queue's delivery limit bounds the retries.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable

from holdfast.pool.tracker import KeyState, PoolTracker
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.poolnames import PoolNames, check_key
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import wire
from holdfast.sdk.session import Session
from holdfast.sdk.types import Ack, AckStatus, Message

log = logging.getLogger(__name__)

BIND_TIMEOUT = 30.0
"""Seconds an orphan waits for its key's queue to be bound before it is retried."""

ACK_TIMEOUT = 30.0
"""Seconds a forward waits for the broker's ACK."""

RETRY_DELAY = 1.0
"""Seconds before an orphan that could not be forwarded comes back."""

STANDBY_DELAY = 0.05
"""Seconds before an orphan a standby manager gave back is delivered again."""


class Forwarder:
    """Write handles on key queues, and a forward that waits for its ACK."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()

    def forward(self, uri: str, message: Message) -> AckStatus:
        """Post ``message`` to ``uri`` under its GUID; return the ACK's status."""
        queue = self._queue(uri)
        done = threading.Event()
        outcome: list[Ack] = []

        def on_ack(ack: Ack) -> None:
            outcome.append(ack)
            done.set()

        queue.post(message.payload, dict(message.properties), on_ack, guid=message.guid)
        if not done.wait(ACK_TIMEOUT):
            return AckStatus.UNKNOWN
        return outcome[0].status

    def release(self, uri: str) -> None:
        """Close the handle on ``uri`` (its key was unbound: the queue may go)."""
        with self._lock:
            queue = self._queues.pop(uri, None)
        if queue is not None:
            try:
                queue.close(timeout=5)
            except HoldfastError as error:
                log.debug("closing %s: %s", uri, error)

    def _queue(self, uri: str) -> Queue:
        with self._lock:
            queue = self._queues.get(uri)
            if queue is not None and queue.is_open:
                return queue
        queue = self._session.open_queue(uri, write=True, timeout=BIND_TIMEOUT)
        with self._lock:
            self._queues[uri] = queue
        return queue


class OrphanProcessor:
    """Forwards orphans to their key's queue once it is bound (module docstring)."""

    def __init__(
        self,
        tracker: PoolTracker,
        names: PoolNames,
        forwarder: Forwarder,
        is_active: Callable[[], bool],
        threads: int = 8,
    ) -> None:
        self._tracker = tracker
        self._is_active = is_active
        self._names = names
        self._forwarder = forwarder
        self._executor = concurrent.futures.ThreadPoolExecutor(threads, "holdfast-pool-orphan")
        self.forwarded = 0
        """Orphans forwarded to their key's queue."""

    def on_message(self, message: Message) -> None:
        """The orphan queue's ``on_message``: hand the orphan to a thread."""
        with contextlib.suppress(RuntimeError):  # closing: the orphan goes back to the queue
            self._executor.submit(self._process, message)

    def close(self) -> None:
        """Stop taking orphans; wait for those in progress."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _process(self, message: Message) -> None:
        if not self._is_active():
            # A standby manager: give it back for the active one (round-robin).
            _settle(message, requeue=True, delay=STANDBY_DELAY)
            return
        key = message.properties.get(wire.KEY)
        try:
            check_key(key)
        except HoldfastError as error:
            log.warning("orphan %s has no valid key (%s): dead-lettered", message.guid, error)
            _settle(message, requeue=False)
            return
        assert key is not None
        generation = self._tracker.activate(key)
        if not self._tracker.wait_bound(key, generation, BIND_TIMEOUT):
            _settle(message, requeue=True)
            return
        uri = self._names.key_queue(key)
        with self._tracker.key_lock(key):
            record = self._tracker.get(key)
            if record is None or record.state is not KeyState.ACTIVE:
                _settle(message, requeue=True)  # unbound meanwhile: try again
                return
            try:
                status = self._forwarder.forward(uri, message)
            except HoldfastError as error:
                log.warning("forwarding orphan %s to %s: %s", message.guid, uri, error)
                status = AckStatus.UNKNOWN
        if status.ok:
            self.forwarded += 1
            _settle(message, requeue=None)
        else:
            _settle(message, requeue=True)


def _settle(message: Message, requeue: bool | None, delay: float = RETRY_DELAY) -> None:
    """Confirm (``requeue`` None) or reject the orphan; a link that is down means the
    broker redelivers it anyway."""
    try:
        if requeue is None:
            message.confirm()
        else:
            message.reject(requeue=requeue, delay=delay if requeue else 0.0)
    except HoldfastError as error:
        log.info("orphan %s: %s", message.guid, error)


__all__ = ["Forwarder", "OrphanProcessor"]

"""Failing the calls of a key whose worker could not start, at once and with the
reason, instead of letting them wait out their pickup timeout.

When the supervisor judges a start failure, the manager consumes the key's queue
itself until the next start attempt: each waiting request is answered with an
error reply (``x-rpc-error: worker-start``) naming the pool, the key, the exit
status and the tail of the worker's stderr, posted under the reply GUID the worker
would have used (so a worker that answers later is deduplicated), and confirmed once
the broker ACKed the error. The caller raises ``WorkerStartError``. A request without
a reply queue is rejected without requeue (to the pool's poison queue); one whose
reply queue is not a caller's reply queue of the pool's domain
(``wire.check_reply_to``) is dropped with a warning, as a worker drops it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from typing import TYPE_CHECKING

from holdfast.pool.drivers import WorkerGroup
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.poolnames import PoolNames
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import wire
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.session import Session

log = logging.getLogger(__name__)

OPEN_TIMEOUT = 10.0
"""Seconds to open the key queue or a caller's reply queue."""


class StartFailureReplies:
    """Answers the requests of keys whose worker could not start (module docstring)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._draining: dict[str, Queue] = {}
        self._replies: dict[str, Queue] = {}
        self._lock = threading.Lock()
        # Opening a reply queue waits on the broker: never on the SDK's callback thread.
        self._executor = concurrent.futures.ThreadPoolExecutor(2, "holdfast-pool-startfail")
        self.failed_calls = 0
        """Requests answered with a start-failure error."""

    def fail(self, group: WorkerGroup, text: str) -> None:
        """Answer ``group``'s waiting requests with ``text`` until ``clear(group)``."""
        with self._lock:
            if group.worker_id in self._draining:
                return
        properties = {wire.POOL: group.pool, wire.KEY: group.key}

        def answer(message: Message) -> None:
            with contextlib.suppress(RuntimeError):  # closing: the broker redelivers it
                self._executor.submit(self._answer, message, text, properties)

        try:
            queue = self._session.open_queue(
                group.requests_queue, read=True, on_message=answer, timeout=OPEN_TIMEOUT
            )
        except HoldfastError as error:
            log.warning("cannot fail the calls of key %r now: %s", group.key[:64], error)
            return
        with self._lock:
            self._draining[group.worker_id] = queue

    def clear(self, group: WorkerGroup) -> None:
        """Stop answering for ``group`` (a worker is about to start, or it stopped)."""
        with self._lock:
            queue = self._draining.pop(group.worker_id, None)
        if queue is not None:
            _close(queue)

    def close(self) -> None:
        """Stop answering for every key; close the reply handles."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            queues = [*self._draining.values(), *self._replies.values()]
            self._draining.clear()
            self._replies.clear()
        for queue in queues:
            _close(queue)

    def _answer(self, message: Message, text: str, extra: dict[str, str]) -> None:
        try:
            header = wire.parse_request(message.properties)
        except ValueError as error:
            log.warning("request %s has no reply queue (%s): dead-lettered", message.guid, error)
            _settle(message, reject=True)
            return
        try:  # the manager's token may write where the caller's may not: no deputy
            wire.check_reply_to(header, PoolNames.of(extra[wire.POOL]).domain, message.guid)
        except ValueError as error:
            log.warning("dropping request %s: %s", message.guid, error)
            _settle(message, reject=False)
            return
        properties = wire.error_properties(message.guid, wire.WORKER_START, "WorkerStartError") | {
            wire.POOL: extra[wire.POOL],
            wire.KEY: extra[wire.KEY],
        }

        def acked(ack: Ack) -> None:
            if ack.status.ok:
                self.failed_calls += 1
                _settle(message, reject=False)
            else:  # redelivered, and answered again
                _settle(message, reject=True, requeue=True)

        try:
            reply = self._reply_queue(header.reply_to)
            reply.post(
                text.encode()[: wire.MAX_ERROR_TEXT * 2],
                properties,
                acked,
                guid=wire.reply_guid(message.guid),
            )
        except HoldfastError as error:
            log.warning("answering request %s: %s", message.guid, error)
            _settle(message, reject=True, requeue=True)

    def _reply_queue(self, uri: str) -> Queue:
        with self._lock:
            queue = self._replies.get(uri)
        if queue is not None and queue.is_open:
            return queue
        queue = self._session.open_queue(uri, write=True, timeout=OPEN_TIMEOUT)
        with self._lock:
            self._replies[uri] = queue
        return queue


def _settle(message: Message, *, reject: bool, requeue: bool = False) -> None:
    try:
        if reject:
            message.reject(requeue=requeue, delay=0.5 if requeue else 0.0)
        else:
            message.confirm()
    except HoldfastError as error:  # the link dropped: the broker redelivers it
        log.info("request %s: %s", message.guid, error)


def _close(queue: Queue) -> None:
    try:
        queue.close(timeout=5)
    except HoldfastError as error:
        log.debug("closing %s: %s", queue, error)


__all__ = ["StartFailureReplies"]

"""Durable PUTs join their queues: the last step of a PUT batch (``broker.puts``).

Once the store has a batch's new messages (or failed to write them), each leaves its
queue's ``in_flight`` map and, when durable, joins the queue's GUID history and its
ready messages; then the queues it touched deliver.
"""

from __future__ import annotations

from operator import attrgetter

from holdfast.broker.queues import Queue
from holdfast.broker.store import StoredMessage

_payload = attrgetter("payload")


def accept(fresh: list[StoredMessage], fresh_queues: list[Queue], durable: bool) -> None:
    """A batch's new messages are durable (or failed): leave ``in_flight``; when
    durable, join their queues and histories. A frame's PUTs mostly share one
    queue: then all at once. Otherwise one by one: posted round-robin over many
    open queues, a frame holds a PUT or two per queue, and grouping them (a dict
    of lists, then lists of GUIDs and digests per queue) cost more than it saved:
    with 10k open queues the broker spent 1.8x the instructions per message of one
    queue (with the history's per-queue costs, ``dedup.GuidHistory.record_new``)."""
    if not fresh:
        return
    first = fresh_queues[0]
    if fresh_queues.count(first) == len(fresh_queues):
        _accept_run(first, fresh, durable)
        return
    touched: dict[int, Queue] = {}
    for message, queue in zip(fresh, fresh_queues, strict=True):
        del queue.in_flight[message.guid]
        queue.in_flight_bytes -= len(message.payload)
        if durable:
            queue.history.record(message.guid, message.digest, message.accepted_at, True)
            queue.accepted += 1
            # Left an object, not packed: a segment per PUT would cost more than it saves.
            queue.add(message)
            touched[id(queue)] = queue
    for queue in touched.values():
        queue.deliver()


def _accept_run(queue: Queue, messages: list[StoredMessage], durable: bool) -> None:
    """``accept`` of messages that all go to ``queue``."""
    in_flight = queue.in_flight
    for message in messages:
        del in_flight[message.guid]
    queue.in_flight_bytes -= sum(map(len, map(_payload, messages)))
    if not durable:
        return
    queue.accepted += len(messages)
    # Admitted after a lookup that missed; in_flight kept each unique since. One
    # frame's messages share their acceptance time.
    queue.history.record_new(
        [message.guid for message in messages],
        [message.digest for message in messages],
        messages[0].accepted_at,
    )
    queue.enqueue_recorded(messages)
    queue.deliver()


__all__ = ["accept"]

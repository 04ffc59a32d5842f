"""Confirms on their way to Redis, and whose they are.

A consumer's CONFIRM takes the message off the consumer at once; the Redis write
that records it follows in a batch (``RedisRegistry.confirmed``) and may fail, or
wait past the node's lease. Until it is recorded, the message is still this node's
delivery in Redis, so once the lease lapses (or Redis answers ``FENCED``) a peer's
reaper gives it to another consumer. The consumer that confirmed it must hear that,
as it hears of the deliveries it still held (``DELIVERIES_REVOKED``): before, such a
message was processed by two consumers and neither was told.
"""

from __future__ import annotations

from holdfast.broker.consumers import Consumer


class UnrecordedConfirms:
    """Confirms this node took and Redis has not recorded yet, by queue and GUID."""

    def __init__(self) -> None:
        self._by_queue: dict[str, dict[bytes, Consumer]] = {}

    def __len__(self) -> int:
        return sum(len(guids) for guids in self._by_queue.values())

    def add(self, uri: str, guid: bytes, consumer: Consumer) -> None:
        """``consumer`` confirmed ``guid`` of ``uri``; the write is on its way."""
        self._by_queue.setdefault(uri, {})[guid] = consumer

    def recorded(self, uri: str, guids: list[bytes]) -> None:
        """Redis recorded (or no longer needs) these confirms."""
        pending = self._by_queue.get(uri)
        if pending is None:
            return
        for guid in guids:
            pending.pop(guid, None)
        if not pending:
            del self._by_queue[uri]

    def void(self, uri: str | None = None, guids: list[bytes] | None = None) -> int:
        """These confirms (``uri``'s ``guids``; every one without ``uri``) will not be
        recorded: each consumer is told its deliveries are void, and they are
        forgotten. How many."""
        queues = list(self._by_queue) if uri is None else [uri]
        told = 0
        for each in queues:
            pending = self._by_queue.get(each, {})
            taken = list(pending) if guids is None or uri is None else guids
            by_consumer: dict[int, tuple[Consumer, list[bytes]]] = {}
            for guid in taken:
                consumer = pending.pop(guid, None)
                if consumer is not None:
                    by_consumer.setdefault(id(consumer), (consumer, []))[1].append(guid)
            for consumer, voided in by_consumer.values():
                consumer.sink.revoke(consumer.queue_id, voided)
                told += len(voided)
            if not pending:
                self._by_queue.pop(each, None)
        return told


__all__ = ["UnrecordedConfirms"]

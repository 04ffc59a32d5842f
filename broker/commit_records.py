"""Commit records: what makes a transactional write's commit whole across a crash.

A commit (``staging_service``) publishes its rows into the store, then records its
commit mark (``marks``), which on a sqlite store lives in a file of its own. A broker
killed between the two would leave the rows published, still staged, and no mark: a
retried commit would publish them again, caught by the dedup history only within its
window. So the commit's ``CommitRecord`` goes into the store in the very transaction
of the rows it publishes (``StoreBatch.commit``): whatever the crash, the store holds
either both or neither.

At start the broker completes every record the store returns (``complete``): records
the mark by the ``MarkBook``'s rules (the same version and digest again is a no-op),
lets the staging book finish the version (the named attempts leave it, the others are
discarded), and has the store forget the record. A retried commit then finds the mark
and publishes nothing, however late it comes. A crash during this is harmless: each
step is a no-op when repeated. In the normal course the commit itself has the store
forget the record once the mark is durable.

The memory store persists nothing, records included; Redis commits in one script and
needs none.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from holdfast.broker.marks import MarkBook
from holdfast.broker.staging import StagingBook
from holdfast.broker.store import CommitRecord
from holdfast.broker.updates import Updates
from holdfast.proto import pb

log = logging.getLogger(__name__)


def commit_record(request: pb.StagingRequest) -> CommitRecord:
    """The record of the commit ``request`` asks for."""
    commit = request.commit
    return CommitRecord(
        request.queue_uri,
        request.app_id,
        request.version,
        bytes(commit.digest),
        commit.rows,
        tuple((a.partition, a.attempt, a.rows) for a in commit.attempts),
    )


def mark_request(record: CommitRecord) -> pb.CommitMarkRequest:
    """The ``CommitMark`` request that records ``record``'s mark."""
    return pb.CommitMarkRequest(
        queue_uri=record.queue_uri,
        app_id=record.app_id,
        record=True,
        version=record.version,
        digest=record.digest,
        rows=record.rows,
    )


def complete(
    records: Iterable[CommitRecord], marks: MarkBook, book: StagingBook, updates: Updates
) -> int:
    """At start, before serving: complete the commits the store recorded (see the
    module docstring); returns how many had lost their mark to a crash. Raises
    ``OSError`` if a mark cannot be stored (the record stays for the next start)."""
    completed = 0
    for record in records:
        before = marks.recorded
        reply = marks.restore(mark_request(record))
        name = f"version {record.version} of {record.app_id[:100]!r} on {record.queue_uri}"
        if reply.status != pb.STATUS_OK:
            # Cannot happen while commits check the mark before they publish; the rows
            # are published whatever the mark says, so the staged copies still go.
            log.error("commit record of %s disagrees with its mark: %s", name, reply.message)
        elif marks.recorded > before:
            completed += 1
            log.warning(
                "completed the commit of %s (%d rows): the broker stopped after publishing "
                "its rows and before recording its mark",
                name,
                record.rows,
            )
        attempts = {(partition, attempt): rows for partition, attempt, rows in record.attempts}
        book.finish(record.queue_uri, record.app_id, record.version, attempts)
        updates.forget_commit(record)
    return completed


__all__ = ["commit_record", "complete", "mark_request"]

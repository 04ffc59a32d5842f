"""The staging book's decisions (``holdfast.broker.staging``), on a manual clock: a commit
publishes exactly the named attempts and discards the rest, a committed version stays
committed, a refused commit publishes nothing, an abort and an expiry discard (the
expiry logged and counted), and the limits hold."""

from __future__ import annotations

import logging

import pytest

from holdfast.broker.staging import (
    AttemptKey,
    CommitOutcome,
    StagedRow,
    StageOutcome,
    StagingBook,
    StagingLimits,
)

URI, APP = "hf://t/q", "query-1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rows(prefix: str, count: int) -> list[StagedRow]:
    return [
        StagedRow(f"{prefix}{i:06d}".encode()[:16].ljust(16, b"-"), b"p", {}) for i in range(count)
    ]


def key(version: int, partition: int, attempt: int) -> AttemptKey:
    return AttemptKey(URI, APP, version, partition, attempt)


def test_a_commit_publishes_the_named_attempts_and_discards_retries_and_copies() -> None:
    book = StagingBook(Clock())
    assert book.stage(key(0, 0, 0), rows("a", 5)) is StageOutcome.STAGED  # failed attempt
    assert book.stage(key(0, 0, 1), rows("a", 5)) is StageOutcome.STAGED  # its retry
    assert book.stage(key(0, 1, 0), rows("b", 3)) is StageOutcome.STAGED
    assert book.stage(key(0, 1, 1), rows("b", 3)) is StageOutcome.STAGED  # speculative
    result = book.commit(URI, APP, 0, {(0, 1): 5, (1, 0): 3})
    assert result.outcome is CommitOutcome.PUBLISHED
    assert sorted(r.guid for r in result.rows) == sorted(
        r.guid for r in rows("a", 5) + rows("b", 3)
    )
    assert result.discarded == 8 and book.discarded_rows == 8
    assert book.committed_version(URI, APP) == 0
    # However late: a replayed stage or commit of version 0 changes nothing.
    assert book.stage(key(0, 0, 2), rows("a", 5)) is StageOutcome.COMMITTED
    assert book.commit(URI, APP, 0, {(0, 2): 5}).outcome is CommitOutcome.ALREADY


def test_a_refused_commit_publishes_nothing_and_an_abort_discards_all() -> None:
    book = StagingBook(Clock())
    book.stage(key(3, 0, 0), rows("a", 4))
    book.stage(key(3, 1, 0), rows("a", 2))  # the same GUIDs: a key in two partitions
    missing = book.commit(URI, APP, 3, {(0, 0): 5, (1, 0): 2})
    assert missing.outcome is CommitOutcome.MISSING and "4 rows staged" in missing.problem
    repeated = book.commit(URI, APP, 3, {(0, 0): 4, (1, 0): 2})
    assert repeated.outcome is CommitOutcome.REPEATED_KEYS and repeated.rows == ()
    assert book.committed_version(URI, APP) is None
    assert book.abort(URI, APP, 3) == 6
    assert book.staged_rows(key(3, 0, 0)) == 0
    assert book.commit(URI, APP, 3, {}).outcome is CommitOutcome.PUBLISHED  # empty version


def test_staged_rows_expire_at_their_deadline_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    book = StagingBook(clock, StagingLimits(retention=60.0))
    book.stage(key(1, 0, 0), rows("a", 7))
    clock.now += 59.0
    assert book.sweep() == 0 and book.staged_rows(key(1, 0, 0)) == 7
    clock.now += 1.0
    with caplog.at_level(logging.WARNING, "holdfast.broker.staging"):
        assert book.sweep() == 7
    assert book.expired_rows == 7 and "7 rows of hf://t/q" in caplog.text
    result = book.commit(URI, APP, 1, {(0, 0): 7})
    assert result.outcome is CommitOutcome.MISSING  # loud, never a partial publish


def test_the_limits_refuse_a_stage_whole() -> None:
    book = StagingBook(Clock(), StagingLimits(max_rows=10, max_bytes=1 << 20))
    assert book.stage(key(0, 0, 0), rows("a", 8)) is StageOutcome.STAGED
    assert book.stage(key(0, 1, 0), rows("b", 3)) is StageOutcome.OVER_LIMIT
    assert book.staged_rows(key(0, 1, 0)) == 0
    book.abort(URI, APP, 0)
    assert book.stage(key(0, 1, 0), rows("b", 3)) is StageOutcome.STAGED

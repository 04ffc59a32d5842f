"""The staging book's decisions (``holdfast.broker.staging``), on a manual clock: a commit
publishes exactly the named attempts and discards the rest, a committed version stays
committed, a refused commit publishes nothing, an abort and an expiry discard (the
expiry logged and counted), and the limits hold."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from holdfast.broker import cli as broker_cli
from holdfast.broker.staging import (
    AttemptKey,
    CommitOutcome,
    StagedRow,
    StageOutcome,
    StagingBook,
    StagingLimits,
)
from holdfast.broker.staging_file import StagingFile

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


def test_a_token_budget_spans_queues_and_an_attempt_belongs_to_its_token() -> None:
    book = StagingBook(Clock(), StagingLimits(max_rows_per_token=10, max_bytes_per_token=1000))
    other = AttemptKey("hf://t/other", "query-2", 0, 0, 0)
    assert book.stage(key(0, 0, 0), rows("a", 6), "alice") is StageOutcome.STAGED
    assert book.stage(other, rows("b", 5), "alice") is StageOutcome.OVER_TOKEN_LIMIT
    assert book.staged_rows(other) == 0  # nothing of a refused call
    assert book.stage(other, rows("b", 5), "bob") is StageOutcome.STAGED
    assert book.stage(key(0, 0, 0), rows("a", 6), "alice") is StageOutcome.STAGED  # a replay
    assert book.stage(key(0, 0, 0), rows("z", 1), "bob") is StageOutcome.OTHER_TOKEN
    assert (book.token_usage("alice"), book.token_usage("bob")) == ((6, 6), (5, 5))
    assert book.stage(key(0, 1, 0), rows("c", 4), "alice") is StageOutcome.STAGED
    assert book.commit(URI, APP, 0, {(0, 0): 6}).discarded == 4
    assert book.token_usage("alice") == (0, 0) and book.token_usage("bob") == (5, 5)
    with pytest.raises(ValueError, match="max_rows_per_token"):
        StagingLimits(max_rows_per_token=0)


def test_the_staging_file_keeps_each_rows_token_and_reads_an_older_file(tmp_path: Path) -> None:
    path = str(tmp_path / "broker.db-staging")
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE staged (queue_uri TEXT, app_id TEXT, version INTEGER, partition INTEGER,"
        " attempt INTEGER, guid BLOB, payload BLOB, properties TEXT, deadline REAL,"
        " PRIMARY KEY (queue_uri, app_id, version, partition, attempt, guid))"
    )
    old.execute(
        "INSERT INTO staged VALUES (?, ?, 0, 0, 0, ?, ?, '{}', 5.0)", (URI, APP, b"g" * 16, b"p")
    )
    old.commit()
    old.close()
    file = StagingFile(path)
    try:
        file.added(key(1, 0, 0), rows("t", 2), 9.0, "alice")
        book = StagingBook(Clock())
        assert book.restore(file, file.load()) == 3
        assert book.token_usage("anonymous") == (1, 1)
        assert book.token_usage("alice") == (2, 2)
    finally:
        file.close()


def test_the_broker_command_line_sets_the_staging_limits() -> None:
    args = broker_cli.build_parser().parse_args(
        [
            *("--stage-retention", "3600"),
            *("--stage-max-rows-per-token", "5"),
            *("--stage-max-bytes-per-token", "100"),
        ]
    )
    assert broker_cli.config_from_args(args).staging == StagingLimits(
        retention=3600.0, max_rows_per_token=5, max_bytes_per_token=100
    )

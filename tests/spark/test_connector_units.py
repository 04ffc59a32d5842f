"""The connector's parts that need no JVM: option checks, batch digests, the
cross-partition key check, and the exactly-once source's write-ahead log."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.marks import CommitMark
from holdfast.sdk.spark.columns import source_row
from holdfast.sdk.spark.guids import BatchDigest, DuplicateRowKeyError, RowGuids
from holdfast.sdk.spark.history import RunHistoryError, check_history
from holdfast.sdk.spark.options import parse_read_options, parse_write_options
from holdfast.sdk.spark.wal import WalError, WriteAheadLog, guids_of, read_segment
from holdfast.sdk.spark.walindex import GuidIndex
from holdfast.sdk.spark.writer import TaskReport, check_keys

URI = "hf://spark/orders"


def test_write_options_are_checked_with_clear_errors() -> None:
    options = parse_write_options(
        {"URI": URI, "keycolumn": "id", "runId": "r1", "checkpointLocation": "/c"}, ["id", "v"]
    )
    assert (options.uri, options.key_column, options.run_id) == (URI, "id", "r1")
    with pytest.raises(InvalidArgumentError, match=r"needs \.option"):
        parse_write_options({}, ["id"])
    with pytest.raises(InvalidArgumentError, match="option uri: invalid queue URI"):
        parse_write_options({"uri": "hf://only-domain"}, ["id"])
    with pytest.raises(InvalidArgumentError, match="no column 'nope'"):
        parse_write_options({"uri": URI, "keyColumn": "nope"}, ["id"])
    with pytest.raises(InvalidArgumentError, match="no option 'keycol'"):
        parse_write_options({"uri": URI, "keycol": "id"}, ["id"])
    with pytest.raises(InvalidArgumentError, match="the port must be a number"):
        parse_write_options({"uri": URI, "address": "localhost:http"}, ["id"])
    with pytest.raises(InvalidArgumentError, match="commitTimeout must be > 0"):
        parse_write_options({"uri": URI, "commitTimeout": "-1"}, ["id"])
    with pytest.raises(InvalidArgumentError, match="flushTimeout must be > 0"):
        parse_write_options({"uri": URI, "flushTimeout": "0"}, ["id"])
    with pytest.raises(InvalidArgumentError, match="runId must not be empty"):
        parse_write_options({"uri": URI, "runId": " "}, ["id"])
    # NaN is no timeout (a write with it hung for good), and a runId names a commit
    # mark, which the broker keeps to 1024 bytes (a longer one failed every task).
    for name in ("flushTimeout", "openTimeout", "commitTimeout"):
        for value in ("nan", "inf"):
            with pytest.raises(InvalidArgumentError, match=f"{name} must be > 0 and finite"):
                parse_write_options({"uri": URI, name: value}, ["id"])
    with pytest.raises(InvalidArgumentError, match="runId is not valid Unicode"):
        parse_write_options({"uri": URI, "runId": "\ud800"}, ["id"])
    with pytest.raises(InvalidArgumentError, match="runId is 1025 bytes; at most 1024"):
        parse_write_options({"uri": URI, "runId": "r" * 1025}, ["id"])
    assert parse_write_options({"uri": URI, "runId": "r" * 1024}, ["id"]).run_id == "r" * 1024
    with pytest.raises(InvalidArgumentError, match="address must not be empty"):
        parse_write_options({"uri": URI, "address": " "}, ["id"])


def test_an_address_without_a_port_gets_the_sdk_default_port() -> None:
    options = parse_write_options({"uri": URI, "address": "localhost, [::1],h:9"}, ["id"])
    assert options.address == "localhost:7701,[::1]:7701,h:9"
    assert (
        parse_read_options({"uri": URI, "address": "broker"}, streaming=True).address
        == "broker:7701"
    )


def test_commit_timeout_and_consume_are_options() -> None:
    written = parse_write_options({"uri": URI, "commitTimeout": "7.5"}, ["id"])
    assert (written.commit_timeout, written.open_timeout) == (7.5, 30.0)
    assert parse_write_options({"uri": URI}, ["id"]).commit_timeout == 60.0
    assert parse_read_options({"uri": URI, "consume": "TRUE"}, streaming=False).consume is True
    assert parse_read_options({"uri": URI}, streaming=False).consume is False
    with pytest.raises(InvalidArgumentError, match="consume must be true or false"):
        parse_read_options({"uri": URI, "consume": "yes"}, streaming=False)


def test_a_mark_ahead_of_the_version_being_written_is_a_loud_reset() -> None:
    mark = CommitMark("query-1", 57, b"d", 100, 0.0)
    check_history(URI, "query-1", 57, mark)  # the sink committed, Spark had not recorded
    check_history(URI, "query-1", 58, mark)
    check_history(URI, "query-1", 0, None)
    with pytest.raises(RunHistoryError, match=r"committed up to version 57 .* version 0"):
        check_history(URI, "query-1", 0, mark)


def test_read_options_are_checked_with_clear_errors() -> None:
    options = parse_read_options(
        {"uri": URI, "walPath": "/w", "maxRowsPerBatch": "50"}, streaming=True
    )
    assert (options.wal_path, options.max_rows_per_batch) == ("/w", 50)
    with pytest.raises(InvalidArgumentError, match="whole number"):
        parse_read_options({"uri": URI, "maxRowsPerBatch": "1.5"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="not a number"):
        parse_read_options({"uri": URI, "maxRowsPerBatch": "many"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="openTimeout must be > 0"):
        parse_read_options({"uri": URI, "openTimeout": "nan"}, streaming=True)
    for name in ("maxRowsPerBatch", "walRetention"):  # int(inf) raised OverflowError
        with pytest.raises(InvalidArgumentError, match=f"{name} must be > 0 and finite"):
            parse_read_options({"uri": URI, name: "inf"}, streaming=True)


def test_a_wal_path_that_is_a_file_is_refused_on_the_driver(tmp_path: Path) -> None:
    a_file = tmp_path / "wal"
    a_file.write_text("")
    with pytest.raises(InvalidArgumentError, match=r"walPath: .* is a file, not a folder"):
        parse_read_options({"uri": URI, "walPath": str(a_file)}, streaming=True)
    assert parse_read_options(
        {"uri": URI, "walPath": str(tmp_path)}, streaming=True
    ).wal_path == str(tmp_path)


def test_the_batch_digest_ignores_row_order_and_task_split_but_sees_content() -> None:
    rows = [(uuid.uuid4(), f"p{i}".encode()) for i in range(50)]
    whole = BatchDigest()
    for guid, payload in rows:
        whole.add(guid, payload)
    left, right = BatchDigest(), BatchDigest()
    for index, (guid, payload) in enumerate(reversed(rows)):
        (left if index % 3 else right).add(guid, payload)
    left.merge(right)
    assert (left.to_bytes(), left.rows) == (whole.to_bytes(), 50)
    changed = BatchDigest()
    for guid, payload in [*rows[:-1], (rows[-1][0], b"other")]:
        changed.add(guid, payload)
    assert changed.to_bytes() != whole.to_bytes()


def test_identical_rows_in_two_partitions_get_distinct_guids() -> None:
    from pyspark.sql import Row

    row = Row(page=1, user="u")
    assert RowGuids(URI, "r", partition=0).for_row(row) != RowGuids(URI, "r", partition=1).for_row(
        row
    )


def report(fingerprints: list[bytes]) -> TaskReport:
    return TaskReport("app", 0, 0, 0, 0, 0, False, 0.0, {}, b"".join(fingerprints))


def test_keys_repeated_across_partitions_are_found() -> None:
    options = parse_write_options({"uri": URI, "keyColumn": "id"}, ["id"])
    a, b = RowGuids(URI, "r", "id"), RowGuids(URI, "r", "id")
    a.for_key(1)
    a.for_key(2)
    b.for_key(3)
    check_keys(options, [report(list(a.key_fingerprints)), report(list(b.key_fingerprints))])
    b.for_key(2)
    with pytest.raises(DuplicateRowKeyError, match="1 values of key column 'id' appear"):
        check_keys(options, [report(list(a.key_fingerprints)), report(list(b.key_fingerprints))])


def test_the_write_ahead_log_keeps_batches_until_committed_then_retains_some(
    tmp_path: Path,
) -> None:
    wal = WriteAheadLog(str(tmp_path / "wal"))
    guids = [uuid.uuid4() for _ in range(6)]
    rows = [source_row(g, g.bytes, {"k": "v", "x-key": str(g)}, URI, 1.7e9, 1) for g in guids]
    wal.write(0, 3, rows[:3])
    wal.write(3, 6, rows[3:])
    first, _ = wal.segments()
    assert list(read_segment(str(first.path))) == rows[:3]
    assert not first.committed and wal.committed_end() == 0
    assert wal.mark_committed(3, retention=1) == 0
    assert wal.committed_end() == 3
    assert [s.committed for s in wal.segments()] == [True, False]
    assert guids_of(wal.segments()[0]) == set(guids[:3])
    assert rows[0][0] == str(guids[0]) and rows[0][5].timestamp() == 1.7e9
    assert wal.mark_committed(6, retention=1) == 3
    assert [(s.start, s.committed) for s in wal.segments()] == [(3, True)]
    with pytest.raises(WalError, match="missing"):
        list(read_segment(str(first.path)))


def test_the_guid_index_finds_a_batch_and_forgets_pruned_ones() -> None:
    index = GuidIndex()
    first, second = [uuid.uuid4() for _ in range(3)], [uuid.uuid4() for _ in range(2)]
    index.add(0, 3, first)
    index.add(3, 5, second)
    assert index.batch_of(first[1]) == (0, 3) and index.batch_of(second[0]) == (3, 5)
    assert index.batch_of(uuid.uuid4()) is None
    index.forget_through(3)
    assert index.batch_of(first[0]) is None and len(index) == 2
    index.close()


def test_out_of_range_options_are_refused_on_the_driver_naming_them() -> None:
    # 2**30 rows per batch passed the driver and failed at run time as the SDK's
    # "max_unconfirmed_messages must be in [0, 2**32)"; 1e-9 s was a commit timeout.
    for value in ("1073741824", "1e300"):
        with pytest.raises(InvalidArgumentError, match="maxRowsPerBatch must be at most"):
            parse_read_options({"uri": URI, "maxRowsPerBatch": value}, streaming=True)
    assert parse_read_options(
        {"uri": URI, "maxRowsPerBatch": "10000000"}, streaming=True
    ).max_rows_per_batch
    with pytest.raises(InvalidArgumentError, match=r"commitTimeout must be at least 0\.1 s"):
        parse_write_options({"uri": URI, "commitTimeout": "1e-9"}, ["id"])
    assert parse_write_options({"uri": URI, "commitTimeout": "0.1"}, ["id"]).commit_timeout
    with pytest.raises(InvalidArgumentError, match="keyColumn must not be empty"):
        parse_write_options({"uri": URI, "keyColumn": ""}, ["id"])


def test_queue_sink_refuses_bad_names_and_run_ids_up_front() -> None:
    from pyspark.sql import Row

    from holdfast.sdk.spark import QueueSink

    for run_id in (None, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="run_id must be a str or an int"):
            QueueSink(URI, run_id=run_id)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="must be column names"):
        QueueSink(URI, run_id="r", key_column="")
    sink = QueueSink(URI, run_id="r", key_column="nope", properties_from=("id",))
    with pytest.raises(InvalidArgumentError, match="key_column: no column 'nope'"):
        sink.write_partition(iter([Row(id=1)]))  # refused before any connection
    sink = QueueSink(URI, run_id="r", properties_from=("nope",))
    with pytest.raises(InvalidArgumentError, match="properties_from: no column 'nope'"):
        sink.check_columns(["id"])

"""The Spark sink's GUIDs, encodings and task behaviour, without a JVM.

``QueueSink.write_partition`` is what a Spark task runs; here it is called directly
with ``pyspark.sql.Row`` objects (pure Python) against a real broker, so these tests
run even where Java is missing.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
import pickle
import random
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark import cloudpickle
from pyspark.sql import Row

from holdfast.sdk import InvalidArgumentError, InvalidQueueUriError, SessionOptions
from holdfast.sdk.spark import (
    DuplicateRowKeyError,
    QueueSink,
    RowGuids,
    SinkError,
    json_default,
    row_to_json,
)
from holdfast.sdk.spark.guids import uuid8, uuid8_bytes
from holdfast.sdk.spark.post import WriteSpec, encoded, encoded_bytes
from holdfast.sdk.spark.rows import canonical_json, row_values
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, drain_messages, unique_uri

URI = "hf://spark/orders"


def order(i: int) -> Row:
    """A row with the column types the default encoding has to handle."""
    return Row(
        id=i,
        name=f"order-{i}",
        amount=decimal.Decimal(i) / 100,
        day=datetime.date(2024, 1, 1) + datetime.timedelta(days=i % 31),
        blob=bytes([i % 256]),
        tags=["a", "b"],
        customer=None if i % 3 == 0 else f"c{i % 7}",
    )


def guids_of(
    rows: list[Row], run_id: str | int = "run-1", key_column: str | None = None
) -> list[uuid.UUID]:
    """The GUIDs one partition attempt gives ``rows``, in order."""
    guids = RowGuids(URI, run_id, key_column)
    return [guids.for_row(row) for row in rows]


# -- GUIDs -----------------------------------------------------------------------------


def test_guids_are_pinned_so_a_change_of_scheme_is_noticed() -> None:
    """A retried task on a newer SDK must still post the same GUIDs: changing how they
    are computed must change ``GUID_SCHEME`` (and these values) on purpose."""
    assert RowGuids(URI, "run-1").for_row(Row(id=1, name="x")) == uuid.UUID(
        "d2e18812-c0d0-88f0-b396-e5f37d594ce1"
    )
    assert RowGuids(URI, "run-1", "id").for_key(1) == uuid.UUID(
        "69f57870-31d8-8f89-a857-fd0097b219b0"
    )


def test_guids_are_rfc_9562_version_8() -> None:
    for guid in guids_of([order(i) for i in range(100)]):
        assert guid.version == 8
        assert guid.variant == uuid.RFC_4122


def test_a_retry_that_sees_the_rows_in_another_order_posts_the_same_guids() -> None:
    """Row order after a shuffle is not stable: the GUIDs do not depend on it, and
    identical rows are numbered #0, #1, ... whichever copy comes first."""
    rows = [order(i) for i in range(200)] + [order(7)] * 3 + [order(9)]
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    first, retry = guids_of(rows), guids_of(shuffled)
    assert len(set(first)) == len(rows)  # identical rows get distinct GUIDs
    assert Counter(first) == Counter(retry)


def test_the_content_key_ignores_column_order_and_sees_every_value() -> None:
    assert guids_of([Row(a=1, b="x")]) == guids_of([Row(b="x", a=1)])
    base = guids_of([Row(a=1, b="x")])
    assert base != guids_of([Row(a=1, b="y")])
    assert base != guids_of([Row(a=1, b="x", c=None)])
    assert guids_of([Row(a=1)]) != guids_of([Row(a="1")])


def test_run_id_and_queue_scope_the_guids() -> None:
    row = Row(id=1)
    assert RowGuids(URI, "run-1").for_row(row) != RowGuids(URI, "run-2").for_row(row)
    assert RowGuids(URI, "r").for_row(row) != RowGuids("hf://spark/other", "r").for_row(row)
    # Length-prefixed fields: moving a character from the URI to the run id changes the GUID.
    assert RowGuids("hf://d/qa", "b").for_row(row) != RowGuids("hf://d/q", "ab").for_row(row)
    # A batch id is a run id by its string form.
    assert RowGuids(URI, 7).for_row(row) == RowGuids(URI, "7").for_row(row)


def test_a_key_column_is_the_whole_row_key() -> None:
    by_key = guids_of([Row(id=1, v="a")], key_column="id")
    assert by_key == guids_of([Row(id=1, v="changed")], key_column="id")
    assert by_key != guids_of([Row(id="1", v="a")], key_column="id")
    assert by_key != guids_of([Row(id=1, v="a")])  # not the content key's GUID


def test_a_duplicate_key_in_a_partition_is_refused_rather_than_dropped() -> None:
    guids = RowGuids(URI, "r", "id")
    guids.for_row(Row(id=1))
    guids.for_row(Row(id=2))
    with pytest.raises(DuplicateRowKeyError, match="key 1 of column 'id' appears twice"):
        guids.for_row(Row(id=1))
    with pytest.raises(InvalidArgumentError, match="key column 'id' is null"):
        guids.for_row(Row(id=None))


# -- encodings -------------------------------------------------------------------------


def test_json_default_covers_spark_types_and_names_the_way_out_for_others() -> None:
    assert json_default(datetime.date(2024, 2, 29)) == "2024-02-29"
    assert (
        json_default(datetime.datetime(2024, 2, 29, 12, 30, 1, 5)) == "2024-02-29T12:30:01.000005"
    )
    assert json_default(decimal.Decimal("12345678901234567890.12")) == "12345678901234567890.12"
    assert json_default(b"\x00\xff") == base64.b64encode(b"\x00\xff").decode()
    assert json_default(bytearray(b"ab")) == "YWI="
    assert json_default(datetime.timedelta(days=1, microseconds=5)) == 86400.000005
    assert json_default(Row(a=1)) == {"a": 1}
    with pytest.raises(TypeError, match="give QueueSink a serializer"):
        json_default(object())


def test_row_to_json_is_compact_in_column_order_and_recursive() -> None:
    row = Row(
        z=1, a=Row(x=decimal.Decimal("1.50"), y=[Row(d=datetime.date(2024, 1, 2))]), m={"k": b"v"}
    )
    assert row_to_json(row) == (
        b'{"z":1,"a":{"x":"1.50","y":[{"d":"2024-01-02"}]},"m":{"k":"dg=="}}'
    )
    assert row_to_json(Row(s="caf\u00e9")) == '{"s":"caf\u00e9"}'.encode()


# -- the sink object -------------------------------------------------------------------


def test_the_sink_pickles_for_executors() -> None:
    sink = QueueSink(URI, run_id="r", key_column="id", properties_from=["a", "b"])
    assert pickle.loads(pickle.dumps(sink)) == sink
    with_lambda = QueueSink(URI, run_id="r", serializer=lambda row: b"%d" % row.id)
    # Spark ships functions and their closures with cloudpickle.
    shipped = pickle.loads(cloudpickle.dumps(with_lambda))  # type: ignore[no-untyped-call]
    assert shipped.serializer is not None and shipped.serializer(Row(id=5)) == b"5"


def test_sink_arguments_are_checked() -> None:
    assert QueueSink(URI, run_id="r", properties_from="customer").properties_from == ("customer",)
    with pytest.raises(InvalidArgumentError, match="run_id"):
        QueueSink(URI, run_id="")
    with pytest.raises(InvalidArgumentError, match="flush_timeout"):
        QueueSink(URI, run_id="r", flush_timeout=0)
    with pytest.raises(InvalidArgumentError, match="flush_timeout"):
        QueueSink(URI, run_id="r", flush_timeout=float("nan"))  # would never run out


def test_write_batch_writes_each_partition_under_the_batch_run_id() -> None:
    class FakeFrame:
        def __init__(self) -> None:
            self.calls: list[Any] = []
            self.columns = ["id", "v"]

        def foreachPartition(self, function: Any) -> None:
            self.calls.append(function)

    frame = FakeFrame()
    sink = QueueSink(URI, run_id="stream-a", key_column="id")
    sink.write_batch(frame, 42)  # type: ignore[arg-type]
    (written,) = frame.calls
    assert written == QueueSink(URI, run_id="stream-a/batch/42", key_column="id")


def test_sink_error_keeps_its_counts_through_pickle() -> None:
    error = SinkError("partial", 10, {"SUCCESS": 7, "UNKNOWN": 3}, 0)
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.posted, again.counts, again.unacked) == (
        "partial",
        10,
        {"SUCCESS": 7, "UNKNOWN": 3},
        0,
    )


# -- a task against a real broker --------------------------------------------------------


def dying_after(rows: list[Row], count: int) -> Iterator[Row]:
    """The rows of a partition whose task dies after handing out ``count`` of them."""
    yield from rows[:count]
    raise RuntimeError("the executor died")


@pytest.mark.timeout(120)
def test_a_task_that_dies_part_way_and_its_retry_leave_each_row_once(broker: BrokerProcess) -> None:
    uri = unique_uri("sink-retry")
    rows = [order(i) for i in range(3000)] + [order(5)] * 2  # and identical rows
    sink = QueueSink(uri, run_id="r", address=broker.address, properties_from=("customer", "id"))
    with pytest.raises(RuntimeError, match="the executor died") as failed:
        sink.write_partition(dying_after(rows, 1000))
    assert any("failed after posting 1000 rows" in note for note in failed.value.__notes__)
    # What the failed attempt posted is in the queue: the retry's copies must be dropped.
    first = drain_messages(broker.address, uri, 1000)
    assert len(first) == 1000

    retry = list(reversed(rows))  # and in another order, as after a shuffle
    result = sink.write_partition(retry)
    assert (result.posted, dict(result.counts)) == (3002, {"SUCCESS": 3002})
    rest = drain_messages(broker.address, uri, 2002)
    messages = first + rest
    assert len({m.guid for m in messages}) == 3002
    assert Counter(m.payload for m in messages) == Counter(row_to_json(r) for r in rows)
    for message in messages:
        row = json.loads(message.payload)
        expected = {"id": str(row["id"])}
        if row["customer"] is not None:  # a null column is left out of the properties
            expected["customer"] = row["customer"]
        assert dict(message.properties) == expected


@pytest.mark.timeout(60)
def test_puts_that_end_unknown_fail_the_task(
    broker_factory: Any,
) -> None:
    """The broker freezes after the first row and thaws after its 1 s dedup window: the
    SDK reports the PUTs it had not got an ACK for UNKNOWN (it will not retransmit
    what the broker may have forgotten), and the task raises so that Spark retries it."""
    broker = broker_factory("--dedup-window", "1")
    sink = QueueSink(
        unique_uri("sink-unknown"), run_id="r", address=broker.address, session_options=FAST
    )

    def frozen_broker_rows() -> Iterator[Row]:
        yield order(0)  # the task's session opens the queue once it has a first row
        os.kill(broker.pid, signal.SIGSTOP)
        threading.Timer(3.0, os.kill, (broker.pid, signal.SIGCONT)).start()
        yield from (order(i) for i in range(1, 100))

    with pytest.raises(SinkError, match="failing the task so that Spark retries it") as failed:
        sink.write_partition(frozen_broker_rows())
    error = failed.value
    assert (error.posted, error.unacked, sum(error.counts.values())) == (100, 0, 100)
    assert error.counts["UNKNOWN"] >= 99  # the first row may have been ACKed in time


@pytest.mark.timeout(60)
def test_acks_missing_after_flush_timeout_fail_the_task(broker: BrokerProcess) -> None:
    sink = QueueSink(
        unique_uri("sink-timeout"),
        run_id="r",
        address=broker.address,
        flush_timeout=1.0,
        session_options=SessionOptions(keepalive_time=5, keepalive_timeout=5),
    )

    def frozen_broker_rows() -> Iterator[Row]:
        yield order(0)  # the task's session opens the queue once it has a first row
        os.kill(broker.pid, signal.SIGSTOP)
        yield from (order(i) for i in range(1, 50))

    try:
        with pytest.raises(SinkError, match=r"(49|50) not ACKed within 1\.0 s") as failed:
            sink.write_partition(frozen_broker_rows())
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    assert failed.value.posted == 50
    assert failed.value.unacked in (49, 50)  # the first row may have been ACKed in time


def test_a_bad_queue_uri_is_a_typed_error(broker: BrokerProcess) -> None:
    sink = QueueSink("orders", run_id="r", address=broker.address)
    with pytest.raises(InvalidQueueUriError):
        sink.write_partition([Row(id=1)])


def test_an_empty_partition_opens_no_session(free_port: int) -> None:
    """Nothing listens on ``free_port``: a session would fail the open after 1 s."""
    sink = QueueSink(URI, run_id="r", address=f"127.0.0.1:{free_port}", open_timeout=1.0)
    result = sink.write_partition(iter([]))
    assert (result.posted, dict(result.counts)) == (0, {})


@pytest.mark.timeout(60)
def test_a_replay_with_changed_content_fails_loudly_with_conflict(broker: BrokerProcess) -> None:
    """A run replayed within the window with other values under the same keys: the
    broker answers CONFLICT (the history keeps a digest of each message), the task
    raises SinkError naming it, and the queue keeps the original rows only."""
    uri = unique_uri("sink-changed")
    sink = QueueSink(uri, run_id="r", address=broker.address, key_column="id")
    rows = [order(i) for i in range(50)]
    assert dict(sink.write_partition(rows).counts) == {"SUCCESS": 50}
    changed = [Row(**{**row.asDict(), "name": "changed"}) for row in rows]
    with pytest.raises(SinkError, match="CONFLICT") as failed:
        sink.write_partition(changed)
    assert dict(failed.value.counts) == {"CONFLICT": 50}
    kept = drain_messages(broker.address, uri, 50)
    assert sorted(m.payload for m in kept) == sorted(row_to_json(r) for r in rows)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.text(min_size=1, max_size=8), _JSON_VALUES, min_size=1, max_size=6))
def test_row_encoding_fast_paths_give_the_bytes_of_the_generic_encoding(
    values: dict[str, Any],
) -> None:
    """Payloads and GUIDs of rows already written must not change: the encoders built
    once and the flat-row shortcut give exactly what ``json.dumps`` of
    ``row.asDict(recursive=True)`` gave."""
    row = Row(**values)
    assert row_values(row) == row.asDict(recursive=True)
    reference = json.dumps(
        row.asDict(recursive=True), default=json_default, separators=(",", ":"), ensure_ascii=False
    )
    assert row_to_json(row) == reference.encode()
    for key in (*values.values(), values):
        canonical = json.dumps(key, default=json_default, separators=(",", ":"), sort_keys=True)
        assert canonical_json(key) == canonical.encode()


@given(st.binary(min_size=32, max_size=32))
def test_guid_bytes_without_the_uuid_are_the_uuids_bytes(digest: bytes) -> None:
    assert uuid8_bytes(digest) == uuid8(digest).bytes


def test_a_tasks_row_encoding_gives_the_guids_and_payloads_of_encoded() -> None:
    """The staging loop's ``encoded_bytes`` agrees with ``encoded`` (content and key
    columns, default and custom serializers)."""
    rows = [Row(id=i % 7, name=f"n{i}", score=i / 3) for i in range(40)]
    for key_column in (None, "name"):
        for serializer in (None, lambda row: repr(row).encode()):
            spec = WriteSpec(URI, key_column=key_column, serializer=serializer)
            one, other = RowGuids(URI, "r", key_column), RowGuids(URI, "r", key_column)
            for row in rows:
                payload, guid = encoded(spec, one, row)
                fast = encoded_bytes(spec, other, row)
                assert fast == (payload, guid.bytes, row[key_column] if key_column else None)

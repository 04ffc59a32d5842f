"""Options that belong to another mode or spelling, checked on the driver without a
JVM: the connector's ``reader``/``streamReader`` are called as Spark calls them (with
the options it was given), ``keyColumn`` is resolved as Spark resolves column names,
and ``QueueSink``'s ``address`` follows the connector's rule."""

from __future__ import annotations

import pytest

from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.spark.options import parse_write_options

URI = "hf://spark/orders"


def batch_reader(**options: str) -> object:
    from holdfast.sdk.spark.connector import HoldfastDataSource

    return HoldfastDataSource({"uri": URI, **options}).reader(None)  # type: ignore[arg-type]


def stream_reader(**options: str) -> object:
    from holdfast.sdk.spark.connector import HoldfastDataSource, RefusedStreamReader

    reader = HoldfastDataSource({"uri": URI, **options}).streamReader(None)  # type: ignore[arg-type]
    if isinstance(reader, RefusedStreamReader):
        raise reader.error  # what Spark's first call on it raises
    return reader


def test_a_batch_read_refuses_the_streaming_only_options_naming_them() -> None:
    # walPath was accepted and ignored: a batch read has no write-ahead log.
    for name, value in (("walPath", "/tmp/wal"), ("walretention", "5")):
        canonical = "walPath" if name == "walPath" else "walRetention"
        with pytest.raises(
            InvalidArgumentError, match=rf"option {canonical} applies only to streaming reads"
        ):
            batch_reader(**{name: value})
    reader = batch_reader(consume="true", maxRowsPerBatch="50", openTimeout="5")
    options = reader.options  # type: ignore[attr-defined]
    assert (options.consume, options.max_rows_per_batch, options.open_timeout) == (True, 50, 5.0)


def test_a_stream_read_refuses_consume_naming_it() -> None:
    # consume was accepted and ignored: a stream read always consumes.
    for value in ("true", "false"):
        with pytest.raises(InvalidArgumentError, match="option consume applies only to batch"):
            stream_reader(consume=value)
    reader = stream_reader(walPath="/tmp/wal", walRetention="5", maxRowsPerBatch="50")
    options = reader.options  # type: ignore[attr-defined]
    assert (options.wal_path, options.wal_retention, options.max_rows_per_batch) == (
        "/tmp/wal",
        5,
        50,
    )


def test_key_column_is_matched_ignoring_case_as_spark_does() -> None:
    # Spark resolves column names ignoring case by default; keyColumn "ID" was refused.
    options = parse_write_options({"uri": URI, "keyColumn": "ORDER_id"}, ["Order_ID", "v"])
    assert options.key_column == "Order_ID"  # the DataFrame's spelling: rows are read by it
    assert parse_write_options({"uri": URI, "keyColumn": "v"}, ["id", "v"]).key_column == "v"
    # Spelled exactly as one of two columns differing in case: that one.
    assert parse_write_options({"uri": URI, "keyColumn": "ID"}, ["id", "ID"]).key_column == "ID"
    with pytest.raises(InvalidArgumentError, match=r"'Id' matches columns 'id' and 'ID'"):
        parse_write_options({"uri": URI, "keyColumn": "Id"}, ["id", "ID"])
    with pytest.raises(InvalidArgumentError, match="no column 'nope'"):
        parse_write_options({"uri": URI, "keyColumn": "nope"}, ["id"])


def test_queue_sink_address_without_a_port_gets_the_default_port_like_the_connector() -> None:
    from holdfast.sdk.spark import QueueSink

    # "localhost" passed the driver and failed every task on the executors ("no port").
    assert QueueSink(URI, run_id="r", address="localhost").address == "localhost:7701"
    sink = QueueSink(URI, run_id="r", address=" broker , [::1],h:9")
    assert sink.address == "broker:7701,[::1]:7701,h:9"
    assert QueueSink(URI, run_id="r").address is None  # $HOLDFAST_ADDRESS on the executor
    with pytest.raises(InvalidArgumentError, match="the port must be a number"):
        QueueSink(URI, run_id="r", address="localhost:http")
    with pytest.raises(InvalidArgumentError, match="address must not be empty"):
        QueueSink(URI, run_id="r", address=" ")
    with pytest.raises(InvalidArgumentError, match="address is a str"):
        QueueSink(URI, run_id="r", address=7701)  # type: ignore[arg-type]

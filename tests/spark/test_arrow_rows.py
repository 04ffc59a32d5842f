"""The Arrow writers' rows (``arrow.batch_records``) against the ``Row``\\s PySpark makes
of the same record batch: the same values, payloads, GUIDs and digests, so a write
read from Arrow and one read from ``Row``\\s are the same write."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.conversion import ArrowTableToRowsConversion
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from holdfast.sdk.spark.arrow import arrow_ready, batch_records
from holdfast.sdk.spark.connector import HoldfastDataSource
from holdfast.sdk.spark.guids import BatchDigest, RowGuids
from holdfast.sdk.spark.post import WriteSpec, encoded, encoded_bytes, row_properties
from holdfast.sdk.spark.writer import ArrowBatchWriter, BatchWriter

URI = "hf://spark/arrow"

COLUMNS: tuple[tuple[str, Any, pa.DataType, st.SearchStrategy[Any]], ...] = (
    ("id", LongType(), pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    ("flag", BooleanType(), pa.bool_(), st.booleans()),
    ("tiny", ByteType(), pa.int8(), st.integers(-128, 127)),
    ("small", ShortType(), pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    ("int", IntegerType(), pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    ("f32", FloatType(), pa.float32(), st.floats(width=32, allow_nan=False)),
    ("f64", DoubleType(), pa.float64(), st.floats(allow_nan=False)),
    ("text", StringType(), pa.string(), st.text()),
    ("day", DateType(), pa.date32(), st.dates(datetime.date(1, 1, 1), datetime.date(9999, 12, 31))),
    (
        "amount",
        DecimalType(12, 3),
        pa.decimal128(12, 3),
        st.decimals(min_value=-(10**8), max_value=10**8, places=3, allow_nan=False),
    ),
)
SCHEMA = StructType([StructField(name, spark_type) for name, spark_type, _, _ in COLUMNS])

rows_strategy = st.lists(
    st.tuples(*(st.none() | values for _, _, _, values in COLUMNS)), min_size=1, max_size=30
)


def record_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    """The batch Spark would hand a writer for ``rows`` of ``SCHEMA``."""
    columns = [
        pa.array([row[i] for row in rows], type=arrow_type)
        for i, (_, _, arrow_type, _) in enumerate(COLUMNS)
    ]
    return pa.record_batch(columns, names=[name for name, _, _, _ in COLUMNS])


def spark_rows(batch: pa.RecordBatch) -> list[Any]:
    """The ``Row``\\s PySpark's data source worker makes of ``batch``."""
    return list(ArrowTableToRowsConversion.convert(pa.Table.from_batches([batch]), SCHEMA))


@settings(max_examples=60, deadline=None)
@given(rows_strategy)
def test_records_give_what_rows_give(rows: list[tuple[Any, ...]]) -> None:
    batch = record_batch(rows)
    records = list(batch_records([batch, batch.slice(0, 0)]))
    from_spark = spark_rows(batch)
    assert len(records) == len(from_spark) == len(rows)
    for key_column in (None, "id"):
        spec = WriteSpec(URI, key_column=key_column)
        # Content keys number identical rows and key columns refuse repeats: one
        # RowGuids per path, fed the same rows in the same order.
        by_record, by_row = RowGuids(URI, "run", key_column, 3), RowGuids(URI, "run", key_column, 3)
        digests = BatchDigest(), BatchDigest()
        seen = set()
        for record, row in zip(records, from_spark, strict=True):
            if key_column is not None and (record["id"] is None or record["id"] in seen):
                break  # a null or repeated key is refused, on both paths alike
            seen.add(record["id"])
            got, want = encoded_bytes(spec, by_record, record), encoded_bytes(spec, by_row, row)
            assert got == want
            assert row_properties(spec, record, got[2]) == row_properties(spec, row, want[2])
            digests[0].add_bytes(got[1], got[0])
            digests[1].add_bytes(want[1], want[0])
        assert digests[0].value == digests[1].value
    plain = WriteSpec(URI)
    content = RowGuids(URI, "run"), RowGuids(URI, "run")
    for record, row in zip(records, from_spark, strict=True):
        assert encoded(plain, content[0], record) == encoded(plain, content[1], row)


def test_only_columns_that_arrive_unconverted_are_read_from_arrow() -> None:
    assert arrow_ready(SCHEMA)
    for other in (
        TimestampType(),
        BinaryType(),
        ArrayType(LongType()),
        MapType(StringType(), LongType()),
        StructType([StructField("x", LongType())]),
    ):
        assert not arrow_ready(StructType([*SCHEMA.fields, StructField("other", other)]))


def test_the_data_source_picks_the_arrow_writer_for_plain_columns() -> None:
    source = HoldfastDataSource({"uri": URI})
    assert type(source.writer(SCHEMA, False)) is ArrowBatchWriter
    timestamped = StructType([*SCHEMA.fields, StructField("at", TimestampType())])
    assert type(source.writer(timestamped, False)) is BatchWriter


def test_decimal_and_date_values_keep_their_python_types() -> None:
    # The JSON of these depends on the Python type (ISO date, Decimal as a string).
    day, amount = datetime.date(2026, 11, 26), decimal.Decimal("1.250")
    (record,) = batch_records([record_batch([(1, True, 1, 1, 1, 1.5, 2.5, "x", day, amount)])])
    assert record["day"] == day and type(record["day"]) is datetime.date
    assert record["amount"] == amount and isinstance(record["amount"], decimal.Decimal)

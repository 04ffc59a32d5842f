"""Rows read from Arrow record batches: the writers' fast path.

PySpark hands a Python data source writer its partition as Arrow record batches and,
for a plain ``DataSourceWriter``, turns every row into a ``Row`` first: a Python call
per value (its converters) and a ``Row`` per row, which was the largest single cost of
a write task. An ``Arrow`` writer (``DataSourceArrowWriter``) gets the batches
themselves; ``batch_records`` turns each into plain dicts of column values, one
``to_pylist`` per column.

Only for schemas whose every column PySpark converts without a converter
(``arrow_ready``): for those, ``to_pylist`` gives exactly the values a ``Row`` would
hold, so payloads, content keys, GUIDs and batch digests are the same on both paths
(a streaming batch replayed by another PySpark version, or a task of a job that mixes
them, writes the same GUIDs). Timestamps (PySpark drops their time zone), binary,
structs, maps, arrays and the rest go through ``Row``\\s as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

ARROW_READY_TYPES: tuple[type[DataType], ...] = (
    BooleanType,
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    StringType,
    DateType,
    DecimalType,
)
"""Column types PySpark passes from Arrow to a ``Row`` unchanged (no converter in
``ArrowTableToRowsConversion``): Arrow's own Python value is the ``Row``'s."""


def arrow_ready(schema: StructType) -> bool:
    """Whether a write of ``schema`` may read Arrow batches (every column's type is one
    of ``ARROW_READY_TYPES``)."""
    return all(isinstance(field.dataType, ARROW_READY_TYPES) for field in schema.fields)


def batch_records(batches: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """Each row of each Arrow ``RecordBatch`` as a dict of its column values, in column
    order: what ``Row.asDict()`` gives for the same row."""
    for batch in batches:
        names = batch.schema.names
        columns = [column.to_pylist() for column in batch.columns]
        for values in zip(*columns, strict=True):
            yield dict(zip(names, values, strict=True))

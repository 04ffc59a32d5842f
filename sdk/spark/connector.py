"""The ``holdfast`` Python data source: ``register(spark)``, then ``format("holdfast")``."""

from __future__ import annotations

from typing import Any, NoReturn

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from holdfast.sdk.errors import HoldfastError, InvalidArgumentError
from holdfast.sdk.spark.arrow import arrow_ready
from holdfast.sdk.spark.columns import SOURCE_SCHEMA
from holdfast.sdk.spark.options import parse_read_options, parse_write_options
from holdfast.sdk.spark.writer import ArrowBatchWriter, ArrowStreamWriter, BatchWriter, StreamWriter

__all__ = ["SOURCE_SCHEMA", "HoldfastDataSource", "RefusedStreamReader", "register"]


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise InvalidArgumentError(
            "format('holdfast') appends to a queue: save mode 'overwrite' would mean "
            "dropping what the queue holds, which a write never does; use "
            ".mode('append') (and `holdfast purge URI` first if that is what you want)"
        )


class HoldfastDataSource(DataSource):
    """``format("holdfast")``: batch and streaming writes, batch and streaming reads.

    Options are checked here, on the driver, when Spark asks for a writer or a reader,
    so a bad one fails the query before any task runs. A DataFrame of plain columns
    (``arrow.arrow_ready``) is written from Arrow batches, any other from ``Row``\\s;
    both give the same GUIDs. Writes append: save mode
    ``overwrite`` is refused (Spark itself refuses ``error``/``ignore`` for this kind
    of source before it asks for a writer).
    """

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "holdfast"

    def schema(self) -> str:
        """The schema of a read (``SOURCE_SCHEMA``)."""
        return SOURCE_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("holdfast").mode("append")...save()``."""
        _refuse_overwrite(overwrite)
        options = parse_write_options(self.options, schema.fieldNames())
        return ArrowBatchWriter(options) if arrow_ready(schema) else BatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("holdfast")...start()`` (output mode append)."""
        _refuse_overwrite(overwrite)
        options = parse_write_options(self.options, schema.fieldNames())
        if ArrowStreamWriter is not None and arrow_ready(schema):
            return ArrowStreamWriter(options)
        return StreamWriter(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        """``spark.read.format("holdfast")...load()``."""
        from holdfast.sdk.spark.batch_read import QueueBatchReader

        return QueueBatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``spark.readStream.format("holdfast")...load()``.

        A bad option gives a reader that raises the error at Spark's first call: PySpark
        (4.x) calls ``reader.stop()`` in a ``finally`` around creating the reader, so an
        error raised here would end in ``UnboundLocalError`` instead of the real one.
        """
        try:
            options = parse_read_options(self.options, streaming=True)
        except HoldfastError as error:
            return RefusedStreamReader(error)
        from holdfast.sdk.spark.source import QueueStreamReader

        return QueueStreamReader(options)


class RefusedStreamReader(DataSourceStreamReader):
    """A stream reader whose options were refused: every call raises the error."""

    def __init__(self, error: HoldfastError) -> None:
        self.error = error

    def initialOffset(self) -> NoReturn:
        """Raise the error."""
        raise self.error

    def latestOffset(self, start: Any = None, limit: Any = None) -> NoReturn:
        """Raise the error."""
        raise self.error

    def partitions(self, start: Any, end: Any) -> NoReturn:
        """Raise the error."""
        raise self.error

    def read(self, partition: Any) -> NoReturn:
        """Raise the error."""
        raise self.error

    def commit(self, end: Any) -> NoReturn:
        """Raise the error."""
        raise self.error

    def stop(self) -> None:
        """Nothing was opened."""


def register(spark: Any) -> None:
    """Make ``format("holdfast")`` available on a SparkSession (PySpark >= 4.0)."""
    spark.dataSource.register(HoldfastDataSource)

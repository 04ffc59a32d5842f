"""The ``holdfast`` Python data source: ``register(spark)``, then ``format("holdfast")``."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from holdfast.sdk.spark.options import parse_read_options, parse_write_options
from holdfast.sdk.spark.writer import BatchWriter, StreamWriter

SOURCE_SCHEMA = "guid STRING, payload BINARY, properties MAP<STRING, STRING>, delivery_count INT"
"""The rows ``spark.readStream.format("holdfast")`` produces: one per message."""


class HoldfastDataSource(DataSource):
    """``format("holdfast")``: batch and streaming writes, streaming reads.

    Options are checked here, on the driver, when Spark asks for a writer or a reader,
    so a bad one fails the query before any task runs.
    """

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "holdfast"

    def schema(self) -> str:
        """The schema of the stream read (``SOURCE_SCHEMA``)."""
        return SOURCE_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("holdfast")...save()``."""
        return BatchWriter(parse_write_options(self.options, schema.fieldNames()))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("holdfast")...start()``."""
        return StreamWriter(parse_write_options(self.options, schema.fieldNames()))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``spark.readStream.format("holdfast")...load()``."""
        from holdfast.sdk.spark.source import QueueStreamReader

        return QueueStreamReader(parse_read_options(self.options))


def register(spark: Any) -> None:
    """Make ``format("holdfast")`` available on a SparkSession (PySpark >= 4.0)."""
    spark.dataSource.register(HoldfastDataSource)

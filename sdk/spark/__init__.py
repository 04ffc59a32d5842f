"""Holdfast for PySpark: the ``format("holdfast")`` connector and ``QueueSink``.

::

    from holdfast.sdk.spark import register
    register(spark)

    df.write.format("holdfast").option("uri", "hf://demo/orders") \\
        .option("keyColumn", "order_id").save()
    df.writeStream.format("holdfast").option("uri", "hf://demo/orders") \\
        .option("checkpointLocation", "/chk/orders").start()
    spark.readStream.format("holdfast").option("uri", "hf://demo/orders").load()
    spark.read.format("holdfast").option("uri", "hf://demo/orders").load()  # a peek

Modules: ``guids`` (deterministic GUIDs, batch digests), ``rows`` (payloads),
``arrow`` (rows read from Arrow record batches, the writers' fast path),
``post`` (one partition into the queue), ``sink`` (``QueueSink`` for
``foreachPartition``/``foreachBatch``), ``options``, ``writer``, ``history`` (loud
resets), ``columns`` (the source's rows), ``source``, ``wal`` and ``walindex`` (the
stream read), ``batch_read`` (the batch read), ``connector`` (the data source and
``register``). The connector needs
PySpark >= 4.0 and pyarrow (``pip install "holdfast-mq[spark]"``) and Java 17; ``QueueSink``
alone imports no pyspark.
"""

from __future__ import annotations

from typing import Any

from holdfast.sdk.spark.columns import KEY_PROPERTY, SOURCE_SCHEMA
from holdfast.sdk.spark.guids import GUID_SCHEME, DuplicateRowKeyError, RowGuids
from holdfast.sdk.spark.history import RunHistoryError
from holdfast.sdk.spark.post import FAILED_TASK_SETTLE_TIMEOUT, SinkError
from holdfast.sdk.spark.rows import json_default, row_to_json
from holdfast.sdk.spark.sink import QueueSink, SinkResult


def register(spark: Any) -> None:
    """Make ``format("holdfast")`` available on ``spark`` (a SparkSession)."""
    # Imported here: the connector needs pyspark's data source API, QueueSink does not.
    from holdfast.sdk.spark.connector import register as register_source

    register_source(spark)


__all__ = [
    "FAILED_TASK_SETTLE_TIMEOUT",
    "GUID_SCHEME",
    "KEY_PROPERTY",
    "SOURCE_SCHEMA",
    "DuplicateRowKeyError",
    "QueueSink",
    "RowGuids",
    "RunHistoryError",
    "SinkError",
    "SinkResult",
    "json_default",
    "register",
    "row_to_json",
]

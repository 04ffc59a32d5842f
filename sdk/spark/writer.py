"""The writers of ``format("holdfast")``: batch (``df.write``) and streaming (``df.writeStream``).

Transactional, like Kafka transactions and Delta's commit protocol: each task stages
its partition with the broker under (application, version, partition, attempt) and
reports a ``TaskReport`` (``task``); the driver's ``commit`` makes exactly the attempts
Spark reports committed visible, together, and records the version's commit mark; an
``abort`` discards everything the version staged (``commit``). So a retried task, a
speculative copy or a restart of any length adds nothing, and a failed job leaves
nothing visible. A version committed once stays committed however late a replay comes
(the mark, kept forever), on every store. A broker that cannot stage (an older one)
gets the rows posted directly, protected by the dedup window and the mark as before.

Application id and version: a batch write is version 0 of a run id made once on the
driver when the writer is created (task retries reuse it); a stream uses the query id
Spark keeps in the checkpoint (local property ``sql.streaming.queryId``; not
``StreamingQuery.runId``, which changes on every restart) and the batch id
(``streaming.sql.batchId``). ``runId`` overrides the application id in both cases.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from holdfast.sdk.errors import HoldfastError, InvalidArgumentError
from holdfast.sdk.spark.arrow import batch_records
from holdfast.sdk.spark.commit import abort_version, check_keys, commit_version, say
from holdfast.sdk.spark.options import WriteOptions
from holdfast.sdk.spark.rows import Record
from holdfast.sdk.spark.spans import spark_span
from holdfast.sdk.spark.task import TaskReport, read_mark, write_task

__all__ = [
    "BATCH_ID_PROPERTY",
    "QUERY_ID_PROPERTY",
    "ArrowBatchWriter",
    "ArrowStreamWriter",
    "BatchWriter",
    "StreamWriter",
    "TaskReport",
    "check_keys",
]

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""Task local property: the streaming query's id, kept in its checkpoint."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""Task local property: the micro-batch id."""


def _aborted(
    options: WriteOptions,
    messages: list[WriterCommitMessage | None],
    version: int,
    app_id: str | None,
) -> None:
    reports = [m for m in messages if isinstance(m, TaskReport)]
    app = app_id or (reports[0].app_id if reports else None)
    discarded = abort_version(options, app, version) if app is not None else 0
    posted = sum(m.posted for m in reports if m.mode != "staged")
    if app is not None and _committed(options, app, version):
        # A commit that outlived the driver's commitTimeout completed on the broker.
        say(
            f"holdfast: version {version} of the write to {options.uri} was committed "
            "after all (the broker finished the commit the driver stopped waiting for): "
            "its rows are visible; a re-run under the same run id adds nothing"
        )
        return
    say(
        f"holdfast: version {version} of the write to {options.uri} aborted: "
        f"{discarded} staged rows discarded, nothing of it visible"
        + (f" ({posted} rows were posted directly and stay)" if posted else "")
    )


def _committed(options: WriteOptions, app_id: str, version: int) -> bool:
    """Whether the broker holds a commit mark at or past ``version`` (False if it cannot
    be read)."""
    try:
        mark = read_mark(options, app_id, options.commit_timeout)
    except HoldfastError:
        return False
    return mark is not None and mark.version >= version


class BatchWriter(DataSourceWriter):
    """``df.write.format("holdfast")``: one version (0) under a run id fixed here, on
    the driver."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.run_id = options.run_id or f"job-{uuid.uuid4()}"

    def write(self, iterator: Iterator[Record]) -> TaskReport:
        """Stage one partition (on an executor)."""
        with spark_span("stage", self.options.uri, self.run_id, 0):
            return write_task(self.options, iterator, self.run_id, 0, self.run_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Make the committed attempts visible, record the mark (on the driver)."""
        with spark_span("commit", self.options.uri, self.run_id, 0):
            commit_version(self.options, messages, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The job failed: discard everything it staged."""
        with spark_span("abort", self.options.uri, self.run_id, 0):
            _aborted(self.options, messages, 0, self.run_id)


class StreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("holdfast")``: version = batch id, application = the
    query id from the checkpoint (or ``runId``)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Record]) -> TaskReport:
        """Stage one partition of a micro-batch (on an executor)."""
        app_id, batch_id = self._task_run()
        with spark_span("stage", self.options.uri, app_id, batch_id):
            return write_task(
                self.options, iterator, app_id, batch_id, f"{app_id}/batch/{batch_id}"
            )

    def _task_run(self) -> tuple[str, int]:
        from pyspark import TaskContext

        context: Any = TaskContext.get()
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        query = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        if batch is None or (query is None and self.options.run_id is None):
            raise InvalidArgumentError(
                "the holdfast stream writer found no streaming batch id or query id in the "
                "task's local properties: it runs inside a writeStream query only"
            )
        return self.options.run_id or f"query-{query}", int(batch)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Make the batch's committed attempts visible, record its mark (driver)."""
        with spark_span("commit", self.options.uri, self.options.run_id or "", batchId):
            commit_version(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The batch failed: discard what it staged. Without a report or a ``runId`` the
        driver does not know the query id: the batch's next commit (Spark runs it again)
        discards the orphaned attempts then."""
        _aborted(self.options, messages, batchId, self.options.run_id)


class ArrowBatchWriter(BatchWriter, DataSourceArrowWriter):
    """``BatchWriter`` reading its partitions as Arrow record batches, for a DataFrame
    whose columns ``arrow.arrow_ready`` accepts: the same rows, GUIDs and digests
    without a ``Row`` per row."""

    def write(self, iterator: Iterator[Any]) -> TaskReport:
        """Stage one partition, read from its record batches (on an executor)."""
        return BatchWriter.write(self, batch_records(iterator))


try:  # PySpark >= 4.1; before it, streams read Rows
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover - PySpark 4.0
    ArrowStreamWriter: type[StreamWriter] | None = None
else:

    class _ArrowStreamWriter(StreamWriter, DataSourceStreamArrowWriter):
        """``StreamWriter`` reading record batches (see ``ArrowBatchWriter``)."""

        def write(self, iterator: Iterator[Any]) -> TaskReport:
            """Stage one partition of a micro-batch, read from its record batches."""
            return StreamWriter.write(self, batch_records(iterator))

    ArrowStreamWriter = _ArrowStreamWriter

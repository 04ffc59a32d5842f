"""The writers of ``format("holdfast")``: batch (``df.write``) and streaming (``df.writeStream``).

Each task posts its partition (``holdfast.sdk.spark.post``) and reports to the driver a
``TaskReport``: rows posted, ACK counts, a digest of its rows and, with a key column,
the fingerprints of its keys. The driver's ``commit``:

1. fails the write if a key appears in two partitions (``DuplicateRowKeyError``; the
   broker kept one row per key, so a row was lost: the writer says so loudly);
2. records the version's **commit mark** with the broker (``Session.commit_mark``):
   application id = the run id (a batch job) or the streaming query id, version = 0
   (a job) or the batch id, with the digest and row count of the version;
3. logs the per-task counts in the driver's log.

Before posting, each task reads the mark: a version already committed is not posted
again, however late the replay (past the dedup window too); the task only computes its
digest, and ``commit`` compares it with the recorded one. A replay with other content
fails with ``SinkError`` (within the dedup window the broker's payload digest answers
its PUTs ``CONFLICT`` and the task fails; past it, the mark's digest differs and the
commit fails).

Run ids: a batch write gets a UUID made once on the driver when the writer is created
(task retries reuse it); a stream uses the query id Spark keeps in the checkpoint
(local property ``sql.streaming.queryId``; not ``StreamingQuery.runId``, which changes
on every restart) and the batch id (``streaming.sql.batchId``). ``runId`` overrides the
application id in both cases.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from holdfast.proto import pb
from holdfast.sdk.errors import CommitMarkConflictError, InvalidArgumentError
from holdfast.sdk.failover import parse_addresses
from holdfast.sdk.marks import CommitMark, call_commit_mark
from holdfast.sdk.options import default_address
from holdfast.sdk.spark.guids import BatchDigest, DuplicateRowKeyError
from holdfast.sdk.spark.history import check_history
from holdfast.sdk.spark.keycheck import count_repeats
from holdfast.sdk.spark.options import WriteOptions
from holdfast.sdk.spark.post import (
    PartitionResult,
    SinkError,
    WriteSpec,
    digest_rows,
    post_rows,
    task_partition,
)

if TYPE_CHECKING:
    from pyspark.sql import Row

log = logging.getLogger("holdfast.sdk.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""Task local property: the streaming query's id, kept in its checkpoint."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""Task local property: the micro-batch id."""


@dataclass
class TaskReport(WriterCommitMessage):
    """What one task sends the driver's ``commit``."""

    app_id: str
    version: int
    partition: int
    posted: int
    rows: int
    digest: int
    skipped: bool
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    key_fingerprints: bytes = b""


def read_mark(options: WriteOptions, app_id: str, timeout: float) -> CommitMark | None:
    """The commit mark of ``app_id`` on the queue (None: never committed)."""
    request = pb.CommitMarkRequest(queue_uri=options.uri, app_id=app_id)
    return call_commit_mark(_addresses(options), request, timeout)


def _addresses(options: WriteOptions) -> list[str]:
    return parse_addresses(options.address or default_address())


def _spec(options: WriteOptions) -> WriteSpec:
    return WriteSpec(
        options.uri,
        options.address,
        options.key_column,
        flush_timeout=options.flush_timeout,
        open_timeout=options.open_timeout,
    )


def write_task(
    options: WriteOptions, rows: Iterator[Row], app_id: str, version: int, run_id: str
) -> TaskReport:
    """One task: skip a version already committed (digest only), else post the rows."""
    partition = task_partition()
    mark = read_mark(options, app_id, options.open_timeout)
    check_history(options.uri, app_id, version, mark)
    skipped = mark is not None and mark.version >= version
    spec = _spec(options)
    result: PartitionResult = (
        digest_rows(spec, rows, run_id, partition)
        if skipped
        else post_rows(spec, rows, run_id, partition)
    )
    return TaskReport(
        app_id,
        version,
        partition,
        result.posted,
        result.digest.rows,
        result.digest.value,
        skipped,
        result.seconds,
        dict(result.counts),
        result.key_fingerprints,
    )


def commit_version(
    options: WriteOptions, messages: Sequence[WriterCommitMessage | None], version: int
) -> None:
    """The driver's commit of one version (see the module docstring)."""
    reports = [m for m in messages if isinstance(m, TaskReport)]
    if not reports:
        _say(f"holdfast: version {version} of a write to {options.uri}: no tasks, nothing written")
        return
    app_id = reports[0].app_id
    _check_keys(options, reports)
    digest = BatchDigest()
    for report in reports:
        digest.merge(BatchDigest(report.digest, report.rows))
    what = f"{options.uri} (application {app_id}, version {version})"
    if any(report.skipped for report in reports):
        mark = read_mark(options, app_id, options.commit_timeout)
        check_history(options.uri, app_id, version, mark)
        if mark is not None and mark.version == version and mark.digest != digest.to_bytes():
            raise SinkError(
                f"{what} was committed before ({mark.rows} rows) with other content than "
                f"this replay ({digest.rows} rows): nothing was written; a corrected batch "
                "needs a new runId (or a new query)"
            )
        _say(f"holdfast: {what} was already committed; this replay wrote nothing")
        return
    request = pb.CommitMarkRequest(
        queue_uri=options.uri,
        app_id=app_id,
        record=True,
        version=version,
        digest=digest.to_bytes(),
        rows=digest.rows,
    )
    try:
        call_commit_mark(_addresses(options), request, options.commit_timeout)
    except CommitMarkConflictError as error:
        raise SinkError(f"{what}: {error.message}; a changed replay is refused") from error
    totals: Counter[str] = Counter()
    for report in reports:
        totals.update(report.counts)
    tasks = "; ".join(
        f"p{r.partition}: {r.posted} rows in {r.seconds:.2f} s"
        for r in sorted(reports, key=lambda r: r.partition)
    )
    _say(
        f"holdfast: committed {what}: {digest.rows} rows from {len(reports)} tasks, "
        f"ACKs {dict(totals)} [{tasks}]"
    )


def _check_keys(options: WriteOptions, reports: Sequence[TaskReport]) -> None:
    if options.key_column is None:
        return
    repeated = count_repeats(report.key_fingerprints for report in reports)
    if repeated:
        raise DuplicateRowKeyError(
            f"{repeated} values of key column {options.key_column!r} appear in more than one "
            f"partition of the write to {options.uri}: the broker kept one row per key, so "
            "rows were lost; use a key that is unique across the DataFrame"
        )


def _say(text: str) -> None:
    """Log on the driver; Spark's Python workers configure no logging, so fall back to
    stderr (which Spark copies to the driver's log)."""
    if log.isEnabledFor(logging.INFO) and (log.handlers or logging.getLogger().handlers):
        log.info("%s", text)
    else:
        print(text, file=sys.stderr, flush=True)


class BatchWriter(DataSourceWriter):
    """``df.write.format("holdfast")``: one version (0) under a run id fixed here, on
    the driver."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.run_id = options.run_id or f"job-{uuid.uuid4()}"

    def write(self, iterator: Iterator[Row]) -> TaskReport:
        """Post one partition (on an executor)."""
        return write_task(self.options, iterator, self.run_id, 0, self.run_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Check keys, record the commit mark, log the counts (on the driver)."""
        commit_version(self.options, messages, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The job failed: say what had been posted (those rows stay in the queue)."""
        posted = sum(m.posted for m in messages if isinstance(m, TaskReport))
        _say(f"holdfast: write {self.run_id} to {self.options.uri} aborted; {posted} rows posted")


class StreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("holdfast")``: version = batch id, application = the
    query id from the checkpoint (or ``runId``)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> TaskReport:
        """Post one partition of a micro-batch (on an executor)."""
        app_id, batch_id = self._task_run()
        return write_task(self.options, iterator, app_id, batch_id, f"{app_id}/batch/{batch_id}")

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
        """Check keys, record the batch's commit mark, log the counts (on the driver)."""
        commit_version(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The batch failed: say what had been posted (the batch is retried by Spark)."""
        posted = sum(m.posted for m in messages if isinstance(m, TaskReport))
        _say(f"holdfast: batch {batchId} to {self.options.uri} aborted; {posted} rows posted")

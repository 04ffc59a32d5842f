"""A write task of ``format("holdfast")``: stage (or post) one partition and report.

Before writing, a task reads its version's commit mark: a version committed already is
not written again, however late the replay (past the dedup window too): the task only
computes its digest, which the driver's commit compares with the recorded one; a mark
*ahead* of the version is a loud reset (``history``). Otherwise the task **stages**
its rows with the broker (``stage``): nothing is visible until the driver commits. A
broker that cannot stage (``UnsupportedCallError``: a broker older than staging)
gets the rows **posted** directly instead (``post``: visible at once, protected
against replays by the broker's dedup window and the commit mark only).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage

from holdfast.proto import pb
from holdfast.sdk.errors import UnsupportedCallError
from holdfast.sdk.failover import parse_addresses
from holdfast.sdk.marks import Channels, CommitMark, call_commit_mark
from holdfast.sdk.options import default_address
from holdfast.sdk.spark.history import check_history
from holdfast.sdk.spark.options import WriteOptions
from holdfast.sdk.spark.post import (
    PartitionResult,
    WriteSpec,
    digest_rows,
    post_rows,
    task_partition,
)
from holdfast.sdk.spark.rows import Record
from holdfast.sdk.spark.stage import stage_rows, task_attempt
from holdfast.sdk.staging import Version, stage

STAGED, POSTED, SKIPPED = "staged", "posted", "skipped"
"""What a task did with its rows (``TaskReport.mode``)."""


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
    attempt: int = 0
    """Spark's task attempt id: the staged attempt the driver's commit names."""
    mode: str = POSTED
    """``staged``, ``posted`` or ``skipped`` (the version was committed already)."""


def addresses(options: WriteOptions) -> list[str]:
    """The broker or proxy addresses of a write."""
    return parse_addresses(options.address or default_address())


def version_target(
    options: WriteOptions,
    app_id: str,
    version: int,
    timeout: float,
    channels: Channels | None = None,
) -> Version:
    """The ``Staging`` calls' target for one version."""
    return Version(addresses(options), options.uri, app_id, version, timeout, None, channels)


def read_mark(options: WriteOptions, app_id: str, timeout: float) -> CommitMark | None:
    """The commit mark of ``app_id`` on the queue (None: never committed)."""
    request = pb.CommitMarkRequest(queue_uri=options.uri, app_id=app_id)
    return call_commit_mark(addresses(options), request, timeout)


def _spec(options: WriteOptions) -> WriteSpec:
    return WriteSpec(
        options.uri,
        options.address,
        options.key_column,
        flush_timeout=options.flush_timeout,
        open_timeout=options.open_timeout,
    )


def write_task(
    options: WriteOptions, rows: Iterator[Record], app_id: str, version: int, run_id: str
) -> TaskReport:
    """One task (see the module docstring)."""
    partition = task_partition()
    attempt = task_attempt()
    mark = read_mark(options, app_id, options.open_timeout)
    check_history(options.uri, app_id, version, mark)
    spec = _spec(options)
    mode = SKIPPED
    result: PartitionResult
    if mark is not None and mark.version >= version:
        result = digest_rows(spec, rows, run_id, partition)
    else:
        channels = Channels()
        target = version_target(options, app_id, version, options.flush_timeout, channels)
        try:
            # An empty stage: does the broker stage, and is the version still open?
            open_version = stage(target, partition, attempt, [])
        except UnsupportedCallError:
            result, mode = post_rows(spec, rows, run_id, partition), POSTED
        else:
            if open_version:
                result, complete = stage_rows(spec, rows, run_id, partition, target, attempt)
                mode = STAGED if complete else SKIPPED
            else:
                result = digest_rows(spec, rows, run_id, partition)
        finally:
            channels.close()
    return TaskReport(
        app_id,
        version,
        partition,
        result.posted,
        result.digest.rows,
        result.digest.value,
        mode == SKIPPED,
        result.seconds,
        dict(result.counts),
        result.key_fingerprints,
        attempt,
        mode,
    )

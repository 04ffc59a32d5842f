"""The driver's side of a ``format("holdfast")`` write: commit or abort one version.

``commit_version`` gets the reports of the task attempts Spark committed:

1. a key-column value in two partitions fails the write (``DuplicateRowKeyError``;
   counted off the heap, ``keycheck``), and a staged version is aborted so nothing of
   it becomes visible;
2. staged tasks: one ``Staging`` commit names exactly those attempts (Spark's task
   attempt ids): the broker publishes their rows together, discards every other
   attempt of the version (failed tries, speculative copies, orphans of an earlier
   driver) and records the version's commit mark with the digest and row count. A
   version committed before answers so (this replay wrote nothing), or CONFLICT if its
   content differs (``SinkError``); rows not all staged any more (expired, or the broker
   restarted) fail the write with nothing of it visible;
3. posted tasks (a broker that cannot stage): the commit mark is recorded directly;
4. the per-task counts go to the driver's log.

``abort_version`` discards what the version's tasks staged: a failed job or batch
leaves nothing visible, except one whose commit got no answer within ``commitTimeout``:
the broker completes a commit it has begun, so its rows may be visible (and the commit
mark recorded: a re-run under the same run id adds nothing).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Sequence

from pyspark.sql.datasource import WriterCommitMessage

from holdfast.proto import pb
from holdfast.sdk.errors import (
    CommitMarkConflictError,
    RequestFailedError,
    RequestTimeoutError,
    UnsupportedCallError,
)
from holdfast.sdk.marks import call_commit_mark
from holdfast.sdk.spark.guids import BatchDigest, DuplicateRowKeyError
from holdfast.sdk.spark.history import check_history
from holdfast.sdk.spark.keycheck import count_repeats
from holdfast.sdk.spark.options import WriteOptions
from holdfast.sdk.spark.post import SinkError
from holdfast.sdk.spark.task import POSTED, STAGED, TaskReport, addresses, read_mark, version_target
from holdfast.sdk.staging import abort, commit

log = logging.getLogger("holdfast.sdk.spark")


def commit_version(
    options: WriteOptions, messages: Sequence[WriterCommitMessage | None], version: int
) -> None:
    """The driver's commit of one version (see the module docstring)."""
    reports = [m for m in messages if isinstance(m, TaskReport)]
    if not reports:
        say(f"holdfast: version {version} of a write to {options.uri}: no tasks, nothing written")
        return
    app_id = reports[0].app_id
    what = f"{options.uri} (application {app_id}, version {version})"
    staged = any(r.mode == STAGED for r in reports)
    try:
        check_keys(options, reports)
    except DuplicateRowKeyError:
        if staged:
            abort_version(options, app_id, version)
        raise
    digest = BatchDigest()
    for report in reports:
        digest.merge(BatchDigest(report.digest, report.rows))
    started = time.monotonic()
    if staged:
        attempts = {(r.partition, r.attempt): r.posted for r in reports if r.mode == STAGED}
        target = version_target(options, app_id, version, options.commit_timeout)
        try:
            reply = commit(target, attempts, digest.to_bytes(), digest.rows)
        except CommitMarkConflictError as error:
            raise SinkError(
                f"{what}: {error.message}; nothing of this write was made visible"
            ) from error
        except RequestTimeoutError as error:
            # The broker runs a commit it has begun to its end whatever the caller
            # does, so no answer in time does not mean nothing was published.
            raise SinkError(
                f"{what}: no answer to the commit within commitTimeout "
                f"({options.commit_timeout:g} s): the broker may have completed it, making "
                "the rows visible, or not begun it; running the write again with the same "
                f"runId is safe: it adds nothing if the commit completed ({error})"
            ) from error
        except RequestFailedError as error:
            if error.status != "NOT_FOUND":
                raise
            raise SinkError(
                f"{what}: {error.message}; nothing of this write was made visible: run it "
                "again (Spark retries a streaming batch when the query restarts)"
            ) from error
        if reply.committed_before:
            say(f"holdfast: {what} was already committed; this replay wrote nothing")
            return
    elif any(r.mode == POSTED for r in reports):
        _record_mark(options, app_id, version, digest, what)
    else:
        mark = read_mark(options, app_id, options.commit_timeout)
        check_history(options.uri, app_id, version, mark)
        if mark is not None and mark.version == version and mark.digest != digest.to_bytes():
            raise SinkError(
                f"{what} was committed before ({mark.rows} rows) with other content than "
                f"this replay ({digest.rows} rows): nothing was written; a corrected batch "
                "needs a new runId (or a new query)"
            )
        say(f"holdfast: {what} was already committed; this replay wrote nothing")
        return
    totals: Counter[str] = Counter()
    for report in reports:
        totals.update(report.counts)
    tasks = "; ".join(
        f"p{r.partition}: {r.posted} rows in {r.seconds:.2f} s"
        for r in sorted(reports, key=lambda r: r.partition)
    )
    say(
        f"holdfast: committed {what}: {digest.rows} rows from {len(reports)} tasks, "
        f"ACKs {dict(totals)} [{tasks}]; commit {time.monotonic() - started:.2f} s"
    )


def _record_mark(
    options: WriteOptions, app_id: str, version: int, digest: BatchDigest, what: str
) -> None:
    request = pb.CommitMarkRequest(
        queue_uri=options.uri,
        app_id=app_id,
        record=True,
        version=version,
        digest=digest.to_bytes(),
        rows=digest.rows,
    )
    try:
        call_commit_mark(addresses(options), request, options.commit_timeout)
    except CommitMarkConflictError as error:
        raise SinkError(f"{what}: {error.message}; a changed replay is refused") from error


def abort_version(options: WriteOptions, app_id: str, version: int) -> int:
    """Discard every attempt the version staged; returns the rows discarded (0 when the
    broker cannot stage: posted rows stay)."""
    target = version_target(options, app_id, version, options.commit_timeout)
    try:
        return abort(target)
    except UnsupportedCallError:
        return 0


def check_keys(options: WriteOptions, reports: Sequence[TaskReport]) -> None:
    """Fail the write if a key-column value appears in two partitions."""
    if options.key_column is None:
        return
    repeated = count_repeats(report.key_fingerprints for report in reports)
    if repeated:
        raise DuplicateRowKeyError(
            f"{repeated} values of key column {options.key_column!r} appear in more than one "
            f"partition of the write to {options.uri}: one row per key would be kept, so "
            "rows would be lost; use a key that is unique across the DataFrame"
        )


def say(text: str) -> None:
    """Log on the driver; Spark's Python workers configure no logging, so fall back to
    stderr (which Spark copies to the driver's log)."""
    if log.isEnabledFor(logging.INFO) and (log.handlers or logging.getLogger().handlers):
        log.info("%s", text)
    else:
        print(text, file=sys.stderr, flush=True)

"""Posting one partition: a session per task, deterministic GUIDs, every ACK awaited.

Shared by ``QueueSink`` (``foreachPartition``/``foreachBatch``) and the
``format("holdfast")`` connector. A task opens one ``Session``, posts every row under
its deterministic GUID, waits until every PUT is ACKed, and raises ``SinkError`` if any
ended otherwise than ``SUCCESS``, so that Spark retries the task.

A session per task, not one per executor reused across tasks: a retried task that
lands on the same Python worker must not find the failed attempt's PUTs still
pending on its session (``post()`` refuses a GUID already pending), and closing the
session at the end of the task settles everything it posted.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from holdfast.sdk.errors import BandwidthLimitError, HoldfastError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.session import Session
from holdfast.sdk.spark.columns import KEY_PROPERTY
from holdfast.sdk.spark.guids import BatchDigest, RowGuids
from holdfast.sdk.spark.rows import Record, payload_json, property_value, row_values
from holdfast.sdk.types import Ack, AckStatus

if TYPE_CHECKING:
    from pyspark.sql import Row

log = logging.getLogger("holdfast.sdk.spark")

FAILED_TASK_SETTLE_TIMEOUT = 5.0
"""Seconds a failing task waits for ACKs of what it already posted before it raises.
Not needed for correctness (the retry re-posts the same GUIDs, and the broker and the
proxy recognise a replay even while the original is in flight); it only lets what
was sent settle, without holding Spark's retry up for long when the broker is away."""


class SinkError(HoldfastError):
    """A partition (or a batch) was not written completely; raised from the Spark task
    so Spark retries it, or from the connector's commit so the job fails.

    ``counts`` maps each ``AckStatus`` name to the number of PUTs that ended so,
    ``unacked`` counts PUTs still without an ACK when the task gave up waiting,
    ``posted`` all PUTs of the attempt. Rows that were ACKed ``SUCCESS`` are in the
    queue; the retry posts them again under the same GUIDs and the broker drops
    those replays.
    """

    def __init__(
        self,
        message: str,
        posted: int = 0,
        counts: Mapping[str, int] | None = None,
        unacked: int = 0,
    ) -> None:
        super().__init__(message)
        self.posted = posted
        self.counts = dict(counts or {})
        self.unacked = unacked

    def __reduce__(self) -> tuple[Any, ...]:
        # Spark may pickle a task's exception; keep the counts through that.
        return (type(self), (str(self), self.posted, self.counts, self.unacked))


@dataclass(frozen=True, slots=True)
class WriteSpec:
    """What a task writes to, and how (see ``QueueSink`` for each field)."""

    uri: str
    address: str | None = None
    key_column: str | None = None
    serializer: Callable[[Row], bytes] | None = None
    properties_from: Sequence[str] = ()
    session_options: SessionOptions | None = None
    flush_timeout: float = 120.0
    open_timeout: float = 30.0


@dataclass(slots=True)
class PartitionResult:
    """What one partition attempt did."""

    posted: int
    counts: Mapping[str, int]
    seconds: float
    digest: BatchDigest = field(default_factory=BatchDigest)
    """Order-independent digest of the partition's (GUID, payload) pairs."""
    key_fingerprints: bytes = b""
    """Concatenated key fingerprints (``key_column`` only), for cross-partition checks."""


class _AckTally:
    """Counts ACK statuses on the SDK's dispatcher thread."""

    def __init__(self) -> None:
        self.counts: Counter[AckStatus] = Counter()
        self._lock = threading.Lock()

    def __call__(self, ack: Ack) -> None:
        with self._lock:
            self.counts[ack.status] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {status.value: n for status, n in self.counts.items()}

    def successes(self) -> int:
        with self._lock:
            return self.counts[AckStatus.SUCCESS]


def task_description() -> str:
    """``"stage 3 partition 1 attempt 0"`` inside a Spark task, else ``"partition"``."""
    context = _task_context()
    if context is None:
        return "partition"
    return (
        f"stage {context.stageId()} partition {context.partitionId()} "
        f"attempt {context.attemptNumber()}"
    )


def task_partition() -> int:
    """The Spark partition id of the running task (0 outside Spark)."""
    context = _task_context()
    return 0 if context is None else int(context.partitionId())


def _task_context() -> Any:
    try:
        from pyspark import TaskContext
    except ImportError:  # not under Spark (called directly)
        return None
    return TaskContext.get()


def row_properties(spec: WriteSpec, row: Record, key: Any = None) -> dict[str, str] | None:
    """A row's message properties: its ``properties_from`` columns (nulls left out) and,
    with a key column, the key as ``x-key`` (the source's ``key`` column, as Kafka's
    record key; ``key`` is its value if the caller read it already)."""
    properties = None
    if spec.properties_from:
        properties = {
            name: property_value(row[name])
            for name in spec.properties_from
            if row[name] is not None
        }
    if spec.key_column is not None:
        properties = properties or {}
        properties[KEY_PROPERTY] = property_value(row[spec.key_column] if key is None else key)
    return properties


def serialized(serializer: Callable[[Row], bytes], row: Record) -> bytes:
    """``serializer(row)``: a user's serializer takes ``Row``\\s, which only ``QueueSink``
    writes with (the connector's Arrow writers have none)."""
    if isinstance(row, dict):
        raise TypeError("a QueueSink serializer is given Spark Rows, not dicts")
    return serializer(row)


def encoded(spec: WriteSpec, guids: RowGuids, row: Record) -> tuple[bytes, uuid.UUID]:
    """A row's payload and GUID."""
    if spec.serializer is None:
        values = row_values(row)
        return payload_json(values), guids.for_row(row, values)
    return serialized(spec.serializer, row), guids.for_row(row)


def encoded_bytes(spec: WriteSpec, guids: RowGuids, row: Record) -> tuple[bytes, bytes, Any]:
    """A row's payload, its GUID's 16 bytes and its key (None without a key column):
    ``encoded`` for a task's hot loop, which needs no UUID object and reads the key
    once."""
    if spec.key_column is not None:
        key = row[spec.key_column]
        if spec.serializer is None:
            payload = payload_json(row_values(row))
        else:
            payload = serialized(spec.serializer, row)
        return payload, guids.for_key_bytes(key), key
    if spec.serializer is None:
        values = row_values(row)
        return payload_json(values), guids.for_content(row, values), None
    return serialized(spec.serializer, row), guids.for_content(row), None


def digest_rows(
    spec: WriteSpec, rows: Iterable[Record], run_id: str, partition: int
) -> PartitionResult:
    """Compute GUIDs and the digest of a partition without posting anything: what a task
    of a version already committed does, so the driver can compare contents."""
    started = time.monotonic()
    guids = RowGuids(spec.uri, run_id, spec.key_column, partition)
    digest = BatchDigest()
    for row in rows:
        payload, guid = encoded(spec, guids, row)
        digest.add(guid, payload)
    return PartitionResult(
        0, {}, time.monotonic() - started, digest, b"".join(guids.key_fingerprints)
    )


def post_rows(
    spec: WriteSpec, rows: Iterable[Record], run_id: str, partition: int
) -> PartitionResult:
    """Post every row, wait for every ACK, and return what happened; raise ``SinkError``
    unless every row was ACKed ``SUCCESS``."""
    started = time.monotonic()
    rows = iter(rows)
    first = next(rows, None)
    if first is None:  # no session for an empty partition (filters leave many)
        return PartitionResult(0, {}, 0.0)
    rows = itertools.chain((first,), rows)
    where = task_description()
    tally = _AckTally()
    digest = BatchDigest()
    posted = 0
    guids = RowGuids(spec.uri, run_id, spec.key_column, partition)
    session = Session(spec.address, options=spec.session_options)
    try:
        queue = session.open_queue(spec.uri, write=True, on_ack=tally, timeout=spec.open_timeout)
        for row in rows:
            payload, guid = encoded(spec, guids, row)
            properties = row_properties(spec, row)
            _post(queue.post, payload, properties, guid, spec.flush_timeout)
            digest.add(guid, payload)
            posted += 1
        flushed = session.flush(spec.flush_timeout)
    except Exception as error:
        session.close(min(spec.flush_timeout, FAILED_TASK_SETTLE_TIMEOUT))
        # Said in the executor's log and on the exception Spark reports for the task.
        note = (
            f"{where}: failed after posting {posted} rows to {spec.uri} "
            f"(run {run_id}); ACKs by status: {tally.snapshot()}"
        )
        log.warning("%s", note)
        error.add_note(note)
        raise
    except BaseException:
        session.close(0)  # interrupted (the task was killed): leave at once
        raise
    unacked = session.pending_count
    counts = tally.snapshot()
    session.close(0)  # everything is ACKed, or we give up on it: nothing to wait for
    elapsed = time.monotonic() - started
    if not flushed or tally.successes() != posted:
        why = f"; {unacked} not ACKed within {spec.flush_timeout} s" if not flushed else ""
        if counts.get("CONFLICT"):
            why += (
                "; CONFLICT: the broker holds some of these GUIDs with other content, "
                "so this run was written before with different rows (a changed replay)"
            )
        raise SinkError(
            f"{where}: {posted} rows posted to {spec.uri} (run {run_id}), "
            f"ACKs by status {counts}{why}; failing the task so that Spark retries it",
            posted,
            counts,
            unacked,
        )
    log.info("%s: %d rows to %s (run %s) in %.1f s", where, posted, spec.uri, run_id, elapsed)
    return PartitionResult(posted, counts, elapsed, digest, b"".join(guids.key_fingerprints))


def _post(
    post: Callable[..., uuid.UUID],
    payload: bytes,
    properties: dict[str, str] | None,
    guid: uuid.UUID,
    timeout: float,
) -> None:
    """Post, waiting out back-pressure: a ``BandwidthLimitError`` means the message was
    not taken, so trying again is safe; give up after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            post(payload, properties, guid=guid)
            return
        except BandwidthLimitError:
            if time.monotonic() >= deadline:
                raise

"""A PySpark sink: write a DataFrame into a Holdfast queue, exactly once under task retries.

::

    from holdfast.sdk.spark import QueueSink

    sink = QueueSink("hf://demo/orders", run_id="orders-2024-06-01", key_column="order_id")
    df.foreachPartition(sink)                       # a batch job

    (stream.writeStream                             # Structured Streaming
        .foreachBatch(QueueSink("hf://demo/orders", run_id="orders-stream").write_batch)
        .option("checkpointLocation", "/checkpoints/orders")
        .start())

Each task opens one ``Session`` (to ``address``, default ``$HOLDFAST_ADDRESS`` or
the local proxy on ``127.0.0.1:7701``), posts every row of its partition, waits
until every PUT is ACKed, and raises ``SinkError`` if any ended otherwise than
``SUCCESS`` (``UNKNOWN``, refused, or not ACKed within ``flush_timeout``), so that
Spark retries the task.

**Deterministic GUIDs.** Spark re-runs failed and speculative tasks. With the SDK's
own uuid7 GUIDs (time and randomness) a retried partition would be enqueued
twice. The sink gives every row a GUID computed from what the row *is*:

    GUID = uuid8(SHA-256(scheme tag, queue URI, run id, row key)[:16])

(RFC 9562 section 5.8, version 8 with the name-based SHA-256 construction of its
appendix B.2; version and variant bits overwritten, 122 bits of hash left.) A
retried task posts the same GUIDs again, and the broker, which remembers the GUIDs
it accepted per queue for its dedup window, ACKs those replays as successes
without enqueueing them again. This is why the sink does not use uuid7 (rule 1 of
the contract is about GUIDs the SDK assigns; here the application supplies them on
purpose, through ``Queue.post(..., guid=...)``).

The row key is, in order of preference:

- ``key_column``: the value of that column (canonical JSON, so ``1`` and ``"1"``
  differ). It must be unique within the run: a key seen twice in one partition
  raises ``DuplicateRowKeyError`` (a null key raises ``InvalidArgumentError``),
  since the broker would otherwise drop the second row as a replay of the first.
  Two rows with the same key in *different* partitions cannot be detected: the
  second one to arrive is dropped. This is the robust choice.
- by default, the row's content (canonical JSON of ``row.asDict(recursive=True)``
  with sorted keys) plus its occurrence number among identical rows in the
  partition: the first copy of a row is ``#0``, the next identical one ``#1``...
  Identical rows are interchangeable, so the numbering does not depend on row
  order, which Spark does not guarantee after a shuffle.

Neither depends on the partition id or a row's position: Spark documents that
``(partitionId, epochId)`` is not a dedup key (a re-planned batch may be split
differently), and row order after a shuffle is not stable.

**Exactly-once conditions.** The queue holds each row exactly once when

1. the input is deterministic for a given run id: a re-run task (or a re-run
   ``foreachBatch`` batch) sees the same rows, with the same content. Sources or
   columns that change between runs (``rand()``, ``current_timestamp()``,
   ``monotonically_increasing_id()`` across re-plans, a table that was written in
   between) produce new GUIDs and so new messages. Timestamps reach Python as
   local times of the executor's time zone: keep executors in one time zone;
2. every retry re-posts a row within the broker's dedup window
   (``--dedup-window``, default 300 s) of the first post of that row: keep tasks
   well under that, or widen the window. A PUT still unACKed after the window is
   reported ``UNKNOWN`` by the SDK, and the task fails rather than guess;
3. with content keys only: identical rows are not spread over several partitions.
   Identical rows in two partitions share their GUIDs (each partition numbers its
   copies from ``#0``), so the queue keeps, for each distinct row, as many copies
   as the partition that holds the most of them; and a re-run that splits
   identical rows differently across partitions would shift their numbering. If
   identical rows are meaningful, name a ``key_column``;
4. the broker keeps its dedup history across restarts (``--store sqlite:PATH``),
   as for any producer.

``run_id`` scopes the GUIDs: the same rows written under another run id are new
messages; written again under the same run id (a re-run of a whole job, or the
same ``foreachBatch`` batch twice) within the window they add nothing.

**Memory.** A task remembers one 16-byte digest per row of its partition (per
distinct row with content keys; about 100 bytes each in Python), for the occurrence
numbers or to catch duplicate keys. Computing a GUID costs a few microseconds.

**Payloads.** By default a row becomes compact JSON of ``row.asDict(recursive=True)``
in column order (dates and timestamps as ISO 8601, decimals as strings to keep
their precision, binary as base64, intervals as seconds); ``serializer`` maps a
row to bytes for anything else. ``properties_from`` names columns to send as
message properties (their value as a string; null values are left out).

A session per task, not one per executor reused across tasks: a retried task that
lands on the same Python worker must not find the failed attempt's PUTs still
pending on its session (``post()`` refuses a GUID already pending), and closing the
session at the end of the task settles everything it posted.

This module does not import pyspark: it needs only what Spark hands it (rows,
``DataFrame.foreachPartition``, ``TaskContext`` when available).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import itertools
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from holdfast.sdk.errors import BandwidthLimitError, HoldfastError, InvalidArgumentError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.session import Session
from holdfast.sdk.types import Ack, AckStatus

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

log = logging.getLogger("holdfast.sdk.spark")

GUID_SCHEME = b"holdfast.sdk.spark/guid/v1"
"""Hashed first into every GUID, so these GUIDs never meet another scheme's; a change
of scheme (or of the canonical row encoding) must change this tag."""

FAILED_TASK_SETTLE_TIMEOUT = 5.0
"""Seconds a failing task waits for ACKs of what it already posted before it raises.
Not needed for correctness (the retry re-posts the same GUIDs, and the broker and the
proxy recognise a replay even while the original is in flight); it only lets what
was sent settle, without holding Spark's retry up for long when the broker is away."""

_KIND_CONTENT = b"c"
_KIND_COLUMN = b"k"

_VERSION_MASK = ~(0xF << 76) & ((1 << 128) - 1)
_VARIANT_MASK = ~(0x3 << 62) & ((1 << 128) - 1)
_VERSION_8_AND_VARIANT = (0x8 << 76) | (0b10 << 62)


class SinkError(HoldfastError):
    """A partition was not written completely; raised from the Spark task so Spark retries it.

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


class DuplicateRowKeyError(InvalidArgumentError):
    """Two rows of one partition have the same ``key_column`` value.

    Both would get the same GUID and the broker would keep only the first, so the
    sink refuses instead of dropping a row silently. Choose a key that is unique
    per row (a retry of the task fails the same way: fix the data or the key).
    """


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for the values PySpark rows hold besides JSON's own.

    Dates, times and timestamps as ISO 8601; ``Decimal`` as a string (a float would
    lose digits); binary as base64; a ``timedelta`` (day-time interval) as seconds.
    A given value always encodes the same way, which the content key relies on.
    """
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    as_dict = getattr(value, "asDict", None)  # a Row nested somewhere asDict did not reach
    if callable(as_dict):
        return as_dict(recursive=True)
    raise TypeError(
        f"cannot turn a {type(value).__name__} into JSON; give QueueSink a serializer "
        "(and a key_column if rows of this type are to be keyed)"
    )


def row_to_json(row: Row) -> bytes:
    """The default serializer: compact UTF-8 JSON of ``row.asDict(recursive=True)``,
    in column order."""
    return _payload_json(row.asDict(recursive=True))


def _payload_json(values: Mapping[str, Any]) -> bytes:
    return json.dumps(
        values, default=json_default, separators=(",", ":"), ensure_ascii=False
    ).encode()


def _canonical_json(value: Any) -> bytes:
    """The stable encoding the row keys are hashed from: sorted keys, no spaces, ASCII."""
    return json.dumps(value, default=json_default, separators=(",", ":"), sort_keys=True).encode()


def _property_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return _canonical_json(value).decode()


def _framed(data: bytes) -> bytes:
    """Length-prefixed, so that no two different field lists hash the same bytes."""
    return len(data).to_bytes(8, "big") + data


def _uuid8(digest: bytes) -> uuid.UUID:
    value = int.from_bytes(digest[:16], "big")
    value = (value & _VERSION_MASK & _VARIANT_MASK) | _VERSION_8_AND_VARIANT
    return uuid.UUID(int=value)


class RowGuids:
    """Deterministic GUIDs for the rows of one partition (see the module docstring).

    One instance per partition attempt: it numbers identical rows (content keys) or
    remembers the keys it has seen (``key_column``), so it must see every row of the
    partition, each once.
    """

    def __init__(self, queue_uri: str, run_id: str | int, key_column: str | None = None) -> None:
        prefix = hashlib.sha256()
        for part in (GUID_SCHEME, queue_uri.encode(), str(run_id).encode()):
            prefix.update(_framed(part))
        self._prefix = prefix
        self._key_column = key_column
        self._occurrences: dict[bytes, int] = {}
        self._seen: set[bytes] = set()

    def for_row(self, row: Row, values: Mapping[str, Any] | None = None) -> uuid.UUID:
        """The GUID of the next row; ``values`` is ``row.asDict(recursive=True)`` if
        the caller already has it."""
        if self._key_column is not None:
            return self.for_key(row[self._key_column])
        if values is None:
            values = row.asDict(recursive=True)
        content = hashlib.sha256(_canonical_json(values)).digest()[:16]
        occurrence = self._occurrences.get(content, 0)
        self._occurrences[content] = occurrence + 1
        hasher = self._prefix.copy()
        hasher.update(_KIND_CONTENT + content + occurrence.to_bytes(8, "big"))
        return _uuid8(hasher.digest())

    def for_key(self, key: Any) -> uuid.UUID:
        """The GUID of the row whose ``key_column`` holds ``key``; a key seen before in
        this partition raises ``DuplicateRowKeyError``."""
        if key is None:
            raise InvalidArgumentError(f"key column {self._key_column!r} is null in a row")
        hasher = self._prefix.copy()
        hasher.update(_KIND_COLUMN + _canonical_json(key))
        digest = hasher.digest()
        marker = digest[:16]
        if marker in self._seen:
            raise DuplicateRowKeyError(
                f"key {key!r} of column {self._key_column!r} appears twice in one partition; "
                "the broker would keep only one of the rows"
            )
        self._seen.add(marker)
        return _uuid8(digest)


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


@dataclass(frozen=True, slots=True)
class SinkResult:
    """What one partition attempt did: rows posted, and ACKs by status name."""

    posted: int
    counts: Mapping[str, int]
    seconds: float


@dataclass(frozen=True)
class QueueSink:
    """Writes rows into one queue with deterministic GUIDs; picklable, so Spark can
    ship it to executors.

    - ``df.foreachPartition(sink)`` writes a DataFrame (``__call__`` takes a
      partition's row iterator);
    - ``stream.writeStream.foreachBatch(sink.write_batch)`` writes each micro-batch
      under the run id ``f"{run_id}/batch/{batch_id}"``, so a batch re-run after a
      restart (same batch id) adds nothing. For streaming, ``run_id`` names the
      query and must stay the same across its restarts (its checkpoint path will do).

    ``address``: the proxy or broker (default ``$HOLDFAST_ADDRESS`` on the executor,
    else ``127.0.0.1:7701``). ``key_column``: a column whose value identifies a row
    within the run (default: the row's content). ``serializer``: row -> payload bytes
    (default: ``row_to_json``); Spark ships it with cloudpickle, so a lambda will do.
    ``properties_from``: columns sent as message properties. ``session_options``:
    for the task's ``Session``. ``flush_timeout``: seconds a task waits for its ACKs
    (and, at most, for back-pressure on one ``post``) before it fails.
    ``open_timeout``: seconds to open the queue.

    See the module docstring for the GUID scheme and when this is exactly once.
    """

    uri: str
    run_id: str | int
    address: str | None = None
    key_column: str | None = None
    serializer: Callable[[Row], bytes] | None = None
    properties_from: Sequence[str] = ()
    session_options: SessionOptions | None = None
    flush_timeout: float = 120.0
    open_timeout: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.properties_from, str):
            # A lone column name would otherwise be read as one column per character.
            object.__setattr__(self, "properties_from", (self.properties_from,))
        else:
            object.__setattr__(self, "properties_from", tuple(self.properties_from))
        if str(self.run_id) == "":
            raise InvalidArgumentError("run_id must not be empty: it scopes the GUIDs")
        if self.flush_timeout <= 0 or self.open_timeout <= 0:
            raise InvalidArgumentError("flush_timeout and open_timeout must be > 0")

    def __call__(self, rows: Iterable[Row]) -> None:
        """Write one partition (``DataFrame.foreachPartition``); raise if any row is
        not ACKed ``SUCCESS``."""
        self.write_partition(rows)

    def write_batch(self, df: DataFrame, batch_id: int) -> None:
        """Write one micro-batch (``foreachBatch``) under the run id
        ``f"{run_id}/batch/{batch_id}"``."""
        df.foreachPartition(self.for_batch(batch_id))

    def for_batch(self, batch_id: int) -> QueueSink:
        """This sink with the run id of micro-batch ``batch_id``."""
        return replace(self, run_id=f"{self.run_id}/batch/{batch_id}")

    def write_partition(self, rows: Iterable[Row]) -> SinkResult:
        """Post every row, wait for every ACK, and return what happened; raise
        ``SinkError`` unless every row was ACKed ``SUCCESS``."""
        started = time.monotonic()
        rows = iter(rows)
        first = next(rows, None)
        if first is None:  # no session for an empty partition (filters leave many)
            return SinkResult(0, {}, 0.0)
        rows = itertools.chain((first,), rows)
        where = _task_description()
        tally = _AckTally()
        posted = 0
        session = Session(self.address, options=self.session_options)
        try:
            queue = session.open_queue(
                self.uri, write=True, on_ack=tally, timeout=self.open_timeout
            )
            guids = RowGuids(self.uri, self.run_id, self.key_column)
            serializer = self.serializer
            props_columns = self.properties_from
            for row in rows:
                if serializer is None:
                    values = row.asDict(recursive=True)
                    payload = _payload_json(values)
                    guid = guids.for_row(row, values)
                else:
                    payload = serializer(row)
                    guid = guids.for_row(row)
                properties = None
                if props_columns:
                    properties = {
                        name: _property_value(row[name])
                        for name in props_columns
                        if row[name] is not None
                    }
                self._post(queue.post, payload, properties, guid)
                posted += 1
            flushed = session.flush(self.flush_timeout)
        except Exception as error:
            session.close(min(self.flush_timeout, FAILED_TASK_SETTLE_TIMEOUT))
            # Said in the executor's log and on the exception Spark reports for the task.
            note = (
                f"{where}: failed after posting {posted} rows to {self.uri} "
                f"(run {self.run_id}); ACKs by status: {tally.snapshot()}"
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
            why = f"{unacked} not ACKed within {self.flush_timeout} s" if not flushed else ""
            raise SinkError(
                f"{where}: {posted} rows posted to {self.uri} (run {self.run_id}), "
                f"ACKs by status {counts}{'; ' + why if why else ''}; "
                "failing the task so that Spark retries it",
                posted,
                counts,
                unacked,
            )
        log.info(
            "%s: %d rows to %s (run %s) in %.1f s", where, posted, self.uri, self.run_id, elapsed
        )
        return SinkResult(posted, counts, elapsed)

    def _post(
        self,
        post: Callable[..., uuid.UUID],
        payload: bytes,
        properties: dict[str, str] | None,
        guid: uuid.UUID,
    ) -> None:
        """Post, waiting out back-pressure: a ``BandwidthLimitError`` means the message
        was not taken, so trying again is safe; give up after ``flush_timeout``."""
        deadline = time.monotonic() + self.flush_timeout
        while True:
            try:
                post(payload, properties, guid=guid)
                return
            except BandwidthLimitError:
                if time.monotonic() >= deadline:
                    raise


def _task_description() -> str:
    """``"stage 3 partition 1 attempt 0"`` inside a Spark task, else ``"partition"``."""
    try:
        from pyspark import TaskContext
    except ImportError:  # not under Spark (called directly)
        return "partition"
    context = TaskContext.get()
    if context is None:
        return "partition"
    return (
        f"stage {context.stageId()} partition {context.partitionId()} "
        f"attempt {context.attemptNumber()}"
    )


__all__ = [
    "FAILED_TASK_SETTLE_TIMEOUT",
    "GUID_SCHEME",
    "DuplicateRowKeyError",
    "QueueSink",
    "RowGuids",
    "SinkError",
    "SinkResult",
    "json_default",
    "row_to_json",
]

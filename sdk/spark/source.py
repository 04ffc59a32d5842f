"""``spark.readStream.format("holdfast")``: a queue as a streaming source, consumed on the driver.

The reader lives in Spark's driver-side Python process for the whole query. It holds one
``Session`` with the queue open for reading; messages arrive there and wait, unconfirmed,
until a micro-batch takes them. Executors never consume: they get a batch's rows from
the driver (at-least-once) or read them from the write-ahead log (exactly-once). A
batch's messages are confirmed only after Spark commits the batch (``commit(end)``), so
a driver crash before that leaves them unconfirmed and the broker redelivers them.

Offsets are ``{"seq": n}``: messages taken into batches by this query so far.

**At-least-once** (default). A batch's rows travel with its partition. After a driver
crash, a batch Spark planned but did not commit cannot be rebuilt (its rows were in the
dead driver): it is run empty, and its messages come again in later batches, redelivered
by the broker (``delivery_count`` > 1). The sink may thus see a message twice: dedup on
the ``guid`` column downstream (``dropDuplicates(["guid"])`` with a watermark, or a
keyed sink such as ``format("holdfast").option("keyColumn", "guid")``).

**Exactly-once** (``walPath``). Before a batch's end offset is returned to Spark, its
messages are written to a segment file under ``walPath`` (fsynced); executors read the
segment. A batch replayed after a driver crash reads the same segment, so it has the
same rows; the broker's redeliveries of those messages are recognised by GUID and
confirmed when the batch commits, not emitted again; after the commit, the segment is
kept (``walRetention`` batches) so late redeliveries are still recognised. Conditions:
``walPath`` is on storage that survives the driver and that executors can read, is used
by this query only, and is kept with the checkpoint (deleting one without the other
breaks the guarantee); the sink is exactly-once itself (idempotent or transactional:
the file sink, ``format("holdfast")``); the query has this reader as its **only
consumer** of the queue.

**Competing consumers.** A queue delivers each message to one of its consumers, round
robin. Two queries (or a query and another application) reading one queue split its
messages between them: each sees a part, which is what a work queue is for, but neither
sees everything, and a message one of them has not confirmed when it crashes may go to
the other. Give each query that needs every message a queue of its own.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from holdfast.sdk.errors import ConfirmDroppedError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.session import Session
from holdfast.sdk.spark.options import ReadOptions
from holdfast.sdk.spark.wal import SourceRow, WalError, WriteAheadLog, guids_of, read_segment
from holdfast.sdk.types import Message

log = logging.getLogger("holdfast.sdk.spark")


class RowsPartition(InputPartition):
    """A batch's rows, shipped with the partition (at-least-once)."""

    def __init__(self, rows: list[SourceRow]) -> None:
        super().__init__(len(rows))
        self.rows = rows


class SegmentPartition(InputPartition):
    """A batch's write-ahead log segment, read by the executor (exactly-once)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def _row(message: Message) -> SourceRow:
    return (str(message.guid), message.payload, dict(message.properties), message.delivery_count)


class QueueStreamReader(DataSourceStreamReader):
    """The streaming reader (see the module docstring)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._lock = threading.Lock()
        self._arrived: list[Message] = []
        self._session: Session | None = None
        # Batches planned and not yet committed: (start, end) -> their messages.
        self._batches: dict[tuple[int, int], list[Message]] = {}
        self._rows: dict[tuple[int, int], list[SourceRow]] = {}
        self._wal = WriteAheadLog(options.wal_path) if options.wal_path else None
        # Exactly-once: GUIDs of uncommitted segments (redeliveries held for the commit)
        # and of committed ones (redeliveries confirmed and dropped).
        self._uncommitted: dict[uuid.UUID, tuple[int, int]] = {}
        self._committed: set[uuid.UUID] = set()
        self._held: dict[tuple[int, int], list[Message]] = {}
        if self._wal is not None:
            committed_end = self._wal.committed_end()
            for segment in self._wal.segments():
                guids = guids_of(segment)
                if segment.committed or segment.end <= committed_end:
                    self._committed |= guids
                else:
                    for guid in guids:
                        self._uncommitted[guid] = (segment.start, segment.end)

    def __getstate__(self) -> dict[str, ReadOptions]:
        # Spark pickles the reader to run ``read`` on executors: they need the options
        # only, never the driver's session, buffers or locks.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, ReadOptions]) -> None:
        self.options = state["options"]

    # -- the consumer on the driver ------------------------------------------------------

    def _ensure_session(self) -> None:
        if self._session is not None:
            return
        session = Session(self.options.address)
        # Room for the batches in flight: nothing is confirmed before Spark commits.
        room = max(4 * self.options.max_rows_per_batch, 1000)
        session.open_queue(
            self.options.uri,
            read=True,
            on_message=self._on_message,
            options=QueueOptions(max_unconfirmed_messages=room),
            timeout=self.options.open_timeout,
        )
        self._session = session

    def _on_message(self, message: Message) -> None:
        # On the SDK's dispatcher thread.
        if message.guid in self._committed:
            _confirm(message)  # a late redelivery of a committed batch
            return
        with self._lock:
            batch = self._uncommitted.get(message.guid)
            if batch is not None:
                self._held.setdefault(batch, []).append(message)
            else:
                self._arrived.append(message)

    # -- Spark's calls ---------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        """A new query starts at 0."""
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRowsPerBatch`` messages per micro-batch."""
        return ReadMaxRows(self.options.max_rows_per_batch)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """Take the messages that arrived (up to the limit) into a new batch."""
        self._ensure_session()
        begin = int(start["seq"])
        if self._wal is not None:
            for segment in self._wal.segments():
                if segment.start == begin and not segment.committed:
                    return {"seq": segment.end}  # planned before a crash: offer it again
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else len(self._arrived)
        with self._lock:
            taken, self._arrived = self._arrived[:most], self._arrived[most:]
        if not taken:
            return {"seq": begin}
        end = begin + len(taken)
        rows = [_row(message) for message in taken]
        if self._wal is not None:
            self._wal.write(begin, end, rows)
            with self._lock:
                for message in taken:
                    self._uncommitted[message.guid] = (begin, end)
        else:
            self._rows[(begin, end)] = rows
        self._batches[(begin, end)] = taken
        return {"seq": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        """One partition per batch in ``[start, end)``."""
        low, high = int(start["seq"]), int(end["seq"])
        if low >= high:
            return []
        if self._wal is not None:
            segments = [s for s in self._wal.segments() if low <= s.start and s.end <= high]
            if sum(s.end - s.start for s in segments) != high - low:
                raise WalError(
                    f"the write-ahead log {self._wal.root} has no batch for offsets "
                    f"{low}..{high}: was it removed, or does it belong to another query?"
                )
            return [SegmentPartition(str(s.path)) for s in segments]
        found = [rows for (s, e), rows in sorted(self._rows.items()) if low <= s and e <= high]
        if not found:
            log.warning(
                "holdfast source: batch %d..%d was planned by an earlier driver; its messages "
                "are redelivered by the broker in later batches (at-least-once)",
                low,
                high,
            )
        return [RowsPartition(rows) for rows in found]

    def read(self, partition: InputPartition) -> Iterator[SourceRow]:
        """The rows of one partition (on an executor)."""
        if isinstance(partition, SegmentPartition):
            yield from read_segment(partition.path)
        elif isinstance(partition, RowsPartition):
            yield from partition.rows

    def commit(self, end: dict[str, int]) -> None:
        """Spark committed every batch up to ``end``: confirm their messages."""
        high = int(end["seq"])
        if self._wal is not None:
            self._wal.mark_committed(high, self.options.wal_retention)
        done = [key for key in self._batches if key[1] <= high]
        with self._lock:
            held = [key for key in self._held if key[1] <= high]
            messages = [m for key in done for m in self._batches.pop(key)]
            messages += [m for key in held for m in self._held.pop(key)]
            for message in messages:
                self._uncommitted.pop(message.guid, None)
                if self._wal is not None:
                    self._committed.add(message.guid)
        for key in done:
            self._rows.pop(key, None)
        for message in messages:
            _confirm(message)

    def stop(self) -> None:
        """The query stopped: close the session (unconfirmed messages are redelivered)."""
        if self._session is not None:
            self._session.close()
            self._session = None


def _confirm(message: Message) -> None:
    try:
        message.confirm()
    except ConfirmDroppedError as error:
        # The broker redelivers it; the exactly-once reader recognises it by GUID then.
        log.warning("holdfast source: a CONFIRM was dropped (%s)", error)

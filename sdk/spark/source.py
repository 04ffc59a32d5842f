"""``spark.readStream.format("holdfast")``: a queue as a streaming source, consumed on the driver.

The reader lives in Spark's driver-side Python process for the whole query. It holds one
``Session`` with the queue open for reading; messages arrive there and wait, unconfirmed,
until a micro-batch takes them. Executors never consume: they get a batch's rows from
the driver (at-least-once) or read them from the write-ahead log (exactly-once). A
batch's messages are confirmed only after Spark has recorded the batch as done (in
``commit(end)``, or when Spark asks for the batch after it), so a driver crash before
that leaves them unconfirmed and the broker redelivers them. Neither call comes after
the last batch of a query stopped by ``query.stop()`` or run with
``trigger(once=True)``, and PySpark kills this process at the query's end without
calling ``stop()``: at-least-once, that batch's messages come again to the next run
(``walPath`` recognises and drops them; ``availableNow`` asks once more and confirms).

Offsets are ``{"seq": n}``: messages taken into batches by this query so far.

**Triggers.** The first batch of a query waits for the queue's backlog to arrive (until
``maxRowsPerBatch`` messages are there, or none has come for ``BACKLOG_QUIET`` seconds,
at most ``openTimeout``), so ``trigger(once=True)`` reads what is there.
``trigger(availableNow=True)`` reads every message the broker accepted before the query
started, in as many batches as that takes, and stops; messages accepted later are left
in the queue for the next run.

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

**Reconnects.** After the SDK reconnects, the broker redelivers every message the
connection before left unconfirmed, some of which the reader still holds: waiting for a
batch (the newer delivery takes the older's place), or in a batch not yet committed
(the newer delivery is confirmed when that batch commits, in the older's stead). Either
way the GUID is in one batch once, in both modes.

**Competing consumers.** A queue delivers each message to one of its consumers, round
robin. Two queries (or a query and another application) reading one queue split its
messages between them: each sees a part, which is what a work queue is for, but neither
sees everything, and a message one of them has not confirmed when it crashes may go to
the other. Give each query that needs every message a queue of its own.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from holdfast.sdk.errors import ConfirmDroppedError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.session import Session
from holdfast.sdk.spark.columns import SourceRow, source_row
from holdfast.sdk.spark.options import ReadOptions
from holdfast.sdk.spark.wal import WalError, WriteAheadLog, guids_of, read_segment
from holdfast.sdk.spark.walindex import GuidIndex
from holdfast.sdk.types import Message

log = logging.getLogger("holdfast.sdk.spark")

BACKLOG_QUIET = 1.0
"""Seconds without a new message after which the backlog is taken to have arrived."""


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


def message_row(message: Message) -> SourceRow:
    """The source row of a delivered message."""
    return source_row(
        message.guid,
        message.payload,
        message.properties,
        message.queue_uri,
        message.accepted_at,
        message.delivery_count,
    )


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader (see the module docstring)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._lock = threading.Lock()
        self._arrival = threading.Condition(self._lock)
        # Delivered and not yet in a batch, by GUID in arrival order.
        self._arrived: dict[uuid.UUID, Message] = {}
        self._last_arrival = time.monotonic()
        self._session: Session | None = None
        self._waited = False
        self._cutoff: float | None = None
        # Batches planned and not yet committed: (start, end) -> their messages.
        self._batches: dict[tuple[int, int], list[Message]] = {}
        # The batch each of their GUIDs is in.
        self._planned: dict[uuid.UUID, tuple[int, int]] = {}
        self._rows: dict[tuple[int, int], list[SourceRow]] = {}
        self._wal = WriteAheadLog(options.wal_path) if options.wal_path else None
        # Exactly-once: which log batch holds a GUID (on disk).
        self._index: GuidIndex | None = None
        self._committed_end = 0
        # Redeliveries of messages in uncommitted batches (both modes), the newest by
        # GUID: confirmed at their batch's commit, instead of the batch's older copy.
        self._held: dict[tuple[int, int], dict[uuid.UUID, Message]] = {}
        if self._wal is not None:
            self._index = GuidIndex()
            self._committed_end = self._wal.committed_end()
            for segment in self._wal.segments():
                self._index.add(segment.start, segment.end, guids_of(segment))

    def __getstate__(self) -> dict[str, ReadOptions]:
        # Spark pickles the reader to run ``read`` on executors: they need the options
        # only, never the driver's session, buffers or locks.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, ReadOptions]) -> None:
        self.options = state["options"]

    # -- the consumer on the driver ------------------------------------------------------

    @property
    def _room(self) -> int:
        # Room for the batches in flight: nothing is confirmed before Spark commits.
        return max(4 * self.options.max_rows_per_batch, 1000)

    def _ensure_session(self) -> None:
        if self._session is not None:
            return
        session = Session(self.options.address)
        session.open_queue(
            self.options.uri,
            read=True,
            on_message=self._on_message,
            options=QueueOptions(max_unconfirmed_messages=self._room),
            timeout=self.options.open_timeout,
        )
        self._session = session

    def _on_message(self, message: Message) -> None:
        # On the SDK's dispatcher thread. A message can come again while this reader
        # holds it: after a reconnect the broker redelivers whatever the connection
        # before left unconfirmed, here, planned into a batch, or in the log. Each GUID
        # goes into one batch once; a later delivery replaces the one the reader holds
        # (only the newest can be confirmed) or is held for its batch's commit.
        committed = False
        with self._arrival:
            guid = message.guid
            if guid in self._arrived:
                self._arrived[guid] = message
                return
            batch = self._planned.get(guid)
            if batch is None and self._index is not None and message.delivery_count > 1:
                batch = self._index.batch_of(guid)
            if batch is None:
                self._arrived[guid] = message
                self._last_arrival = time.monotonic()
                self._arrival.notify_all()
            elif batch[1] <= self._committed_end:
                committed = True
            else:
                self._held.setdefault(batch, {})[guid] = message  # the newest kept
        if committed:
            _confirm(message)  # a late redelivery of a committed batch

    def _eligible(self, most: int) -> list[Message]:
        """Up to ``most`` of what may go into a batch, in arrival order: under
        availableNow, what was accepted before it."""
        arrived = self._arrived.values()
        cutoff = self._cutoff
        if cutoff is not None:
            return list(itertools.islice((m for m in arrived if m.accepted_at <= cutoff), most))
        return list(itertools.islice(arrived, most))

    def _eligible_count(self) -> int:
        """How many messages may go into a batch now (see ``_eligible``)."""
        cutoff = self._cutoff
        if cutoff is None:
            return len(self._arrived)
        return sum(1 for m in self._arrived.values() if m.accepted_at <= cutoff)

    def _wait_for_backlog(self, most: int) -> None:
        """Wait until ``most`` messages are here, or none came for ``BACKLOG_QUIET``
        seconds, or the consumer's room is full; at most ``openTimeout``."""
        deadline = time.monotonic() + self.options.open_timeout
        in_flight = sum(len(batch) for batch in self._batches.values())
        with self._arrival:
            while True:
                now = time.monotonic()
                quiet_until = self._last_arrival + BACKLOG_QUIET
                if (
                    self._eligible_count() >= most
                    or len(self._arrived) + in_flight >= self._room
                    or now >= quiet_until
                    or now >= deadline
                ):
                    return
                self._arrival.wait(min(quiet_until, deadline) - now)

    # -- Spark's calls ---------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        """A new query starts at 0."""
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRowsPerBatch`` messages per micro-batch."""
        return ReadMaxRows(self.options.max_rows_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """``trigger(availableNow=True)``: read what the broker accepted until now."""
        self._cutoff = time.time()
        self._ensure_session()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """Take the messages that arrived (up to the limit) into a new batch.

        Spark asks for the next batch only once the batch ending at ``start`` is done
        and recorded in its commit log (one batch at a time), so batches up to ``start``
        are settled here already: the last batch before an idle spell, or the last of an
        ``availableNow`` run, need not wait for a next batch to be confirmed."""
        self._ensure_session()
        begin = int(start["seq"])
        if begin > self._committed_end:
            self._settle_through(begin)
        if self._wal is not None:
            for segment in self._wal.segments():
                if segment.start == begin and not segment.committed:
                    return {"seq": segment.end}  # planned before a crash: offer it again
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else self._room
        if not self._waited or self._cutoff is not None:
            self._wait_for_backlog(most)
            self._waited = True
        with self._lock:
            taken = self._eligible(most)
            end = begin + len(taken)
            for message in taken:
                del self._arrived[message.guid]
                # Before the lock is let go: a redelivery that comes while the batch
                # is written to the log and its index must find it planned.
                self._planned[message.guid] = (begin, end)
        if not taken:
            return {"seq": begin}
        rows = [message_row(message) for message in taken]
        if self._wal is not None and self._index is not None:
            self._wal.write(begin, end, rows)
            self._index.add(begin, end, (message.guid for message in taken))
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
        self._settle_through(int(end["seq"]))

    def _settle_through(self, high: int) -> None:
        if self._wal is not None and self._index is not None:
            pruned = self._wal.mark_committed(high, self.options.wal_retention)
            self._index.forget_through(pruned)
        done = [key for key in self._batches if key[1] <= high]
        with self._lock:
            self._committed_end = max(self._committed_end, high)
            held = [key for key in self._held if key[1] <= high]
            redelivered = [m for key in held for m in self._held.pop(key).values()]
            # A batch's message delivered again since is confirmed by its newer delivery.
            newer = {m.guid for m in redelivered}
            messages = []
            for key in done:
                for message in self._batches.pop(key):
                    self._planned.pop(message.guid, None)
                    if message.guid not in newer:
                        messages.append(message)
            messages += redelivered
        for key in done:
            self._rows.pop(key, None)
        for message in messages:
            _confirm(message)

    def stop(self) -> None:
        """The query stopped: close the session (unconfirmed messages are redelivered).
        PySpark 4 kills the reader's process instead of calling this at a query's end;
        the broker redelivers the same when the connection drops."""
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._index is not None:
            self._index.close()
            self._index = None


def _confirm(message: Message) -> None:
    try:
        message.confirm()
    except ConfirmDroppedError as error:
        # The broker redelivers it; the exactly-once reader recognises it by GUID then.
        log.warning("holdfast source: a CONFIRM was dropped (%s)", error)

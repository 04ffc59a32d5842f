"""A durable ``Store`` in one SQLite file, in WAL mode, with group commit.

``holdfast-broker --store sqlite:PATH [--sync full|normal]``.

What persists: every accepted message (queue, GUID, payload, properties, acceptance
time), its queue order and delivery count, the GUID history of the dedup window, queue
policies, and the record of each transactional commit (``store.CommitRecord``) until its
commit mark is durable.
A message leaves the file when its consumer confirms it; a history entry stays until
its window has passed, so that after a restart (even a kill -9) a retransmitted PUT is
still recognised as a replay.

Threads and group commit
------------------------

One writer thread owns the only connection. ``write()`` runs on the broker's event
loop: it queues the batch and returns an ``asyncio.Future`` of that loop. The writer
takes every batch queued so far, applies them in order in one transaction, commits,
and resolves all their futures with one ``call_soon_threadsafe``. While one commit
waits for its fsync the next group accumulates, so the cost of an fsync is shared by
every PUT that arrived meanwhile. If a group's transaction fails, each of its batches
is retried in a transaction of its own, so one bad batch fails only its own PUTs.
``recover()`` runs on the writer thread as well (the caller waits for it).

Sync modes (``PRAGMA synchronous``)
-----------------------------------

* ``full`` (the default): every commit is fsynced before its PUTs are ACKed. An ACKed
  message survives a process crash, a kill -9, an OS crash and a power loss.
* ``normal``: in WAL mode commits are written to the OS but fsynced only at
  checkpoints. An ACKed message survives a process crash or a kill -9 (the OS still
  has the data); an OS crash or a power loss may lose the last commits (the file
  stays consistent, it just goes back in time).

The file's layout and how it is read back are in ``sqlite_schema``.

The connection holds SQLite's exclusive lock for its whole life
(``locking_mode=EXCLUSIVE``), so a second broker on the same file fails at start
instead of corrupting the queues; the OS releases the lock when a broker dies.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import queue
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from holdfast.broker.dedup import DEFAULT_GRACE, DEFAULT_WINDOW, BrokerClock
from holdfast.broker.sqlite_rows import Rows, prune_history
from holdfast.broker.sqlite_schema import SCHEMA_VERSION, connect, describe, read_state
from holdfast.broker.store import (
    COMPLETED,
    RecoveredState,
    StoreBatch,
    StoreError,
    settle_futures,
)

log = logging.getLogger(__name__)

SYNC_MODES = ("full", "normal")
"""``--sync`` values: the SQLite ``synchronous`` setting of the store."""

DEFAULT_SYNC = "full"
"""Safe by default: an ACKed message survives a power loss."""

PRUNE_CHUNK = 2000
"""Most expired history rows deleted per transaction: small, so a PUT's commit never
waits behind a large delete."""

PRUNE_INTERVAL = 1.0
"""Seconds between looks for expired history once nothing was left to prune."""

T = TypeVar("T")


@dataclass(slots=True)
class _Write:
    """A batch waiting for the writer, and the future its caller awaits."""

    batch: StoreBatch
    future: asyncio.Future[None]


@dataclass(slots=True)
class _Job:
    """Something else to run on the writer thread, in queue order (``recover()``)."""

    run: Callable[[sqlite3.Connection], Any]
    result: concurrent.futures.Future[Any]


_STOP = object()
"""Queued by ``close()``: everything before it is written, then the writer exits."""


class SqliteStore:
    """A ``Store`` in the SQLite file at ``path`` (created if it does not exist).

    The constructor opens and checks the file and raises ``StoreError`` (naming the
    path and the problem) if it cannot be used: not a database, not a Holdfast store,
    another schema version, a directory, a missing directory, no permission, in use by
    another broker. ``dedup_window`` and ``dedup_grace`` are the broker's: history
    older than their sum (on ``clock``, resumed at recovery) is not
    recovered and is pruned. ``sync`` is one of ``SYNC_MODES``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dedup_window: float = DEFAULT_WINDOW,
        dedup_grace: float = DEFAULT_GRACE,
        sync: str = DEFAULT_SYNC,
        clock: BrokerClock | None = None,
        prune_chunk: int = PRUNE_CHUNK,
        prune_interval: float = PRUNE_INTERVAL,
    ) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, got {sync!r}")
        if dedup_window <= 0 or dedup_grace < 0:
            raise ValueError("dedup_window must be > 0 seconds and dedup_grace >= 0")
        if prune_chunk <= 0 or prune_interval <= 0:
            raise ValueError("prune_chunk and prune_interval must be > 0")
        self.path = os.fspath(path)
        self.dedup_window = dedup_window
        self.retention = dedup_window + dedup_grace
        """Seconds a history row is kept after its acceptance (broker clock)."""
        self.sync = sync
        self._clock = BrokerClock() if clock is None else clock
        self._prune_chunk = prune_chunk
        self._prune_interval = prune_interval
        self.commits = 0
        """Transactions committed that carried batches (a measure of group commit)."""
        self.batches = 0
        """Batches made durable."""
        self.pruned = 0
        """Expired history rows deleted."""
        self._queue: queue.SimpleQueue[_Write | _Job | object] = queue.SimpleQueue()
        # Guards the decision "is the writer still taking work" against write()/close().
        self._lock = threading.Lock()
        self._closed = False
        self._failure: BaseException | None = None
        self._rows = Rows({}, 1)
        # No pruning before recover() or the first commit: a store that turns out to be
        # unreadable must fail in recover(), not first log a failed prune.
        self._next_prune = math.inf
        opened: concurrent.futures.Future[sqlite3.Connection] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run,
            args=(opened,),
            name=f"holdfast-sqlite-writer:{os.path.basename(self.path)}",
            # A broker that dies without close() must not hang on this thread; SQLite's
            # atomic commit keeps the file consistent whatever the thread was doing.
            daemon=True,
        )
        self._thread.start()
        try:
            opened.result()
        except StoreError:
            self._thread.join()
            raise

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r}, sync={self.sync!r})"

    # -- the Store protocol (broker event loop thread) ----------------------------------

    def recover(self) -> RecoveredState:
        """Read every queue (messages in acceptance order, with delivery counts) and
        the GUID history still inside the dedup window. Raises ``StoreError`` if the
        file cannot be read."""
        return self._call(self._recover)

    def write(self, batch: StoreBatch) -> Awaitable[None]:
        """Queue ``batch`` for the next group commit; the returned future completes once
        it is committed, or fails with ``StoreError``. Must be called on the event loop
        whose future is returned."""
        if not batch:
            return COMPLETED
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._closed or self._failure is not None:
                future.set_exception(self._unavailable())
                return future
            self._queue.put(_Write(batch, future))
        return future

    def close(self) -> None:
        """Commit what was already taken, stop the writer thread, close the file.
        Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._thread.join()

    # -- helpers of the caller's side ---------------------------------------------------

    def _unavailable(self) -> StoreError:
        if self._failure is not None:
            return StoreError(f"sqlite store {self.path} failed: {self._failure}")
        return StoreError(f"sqlite store {self.path} is closed")

    def _call(self, run: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``run(connection)`` on the writer thread, after what is queued; wait."""
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed or self._failure is not None:
                raise self._unavailable()
            self._queue.put(_Job(run, result))
        return result.result()

    # -- the writer thread ----------------------------------------------------------------

    def _run(self, opened: concurrent.futures.Future[sqlite3.Connection]) -> None:
        try:
            connection, queue_ids, next_seq = connect(self.path, self.sync)
            self._rows = Rows(queue_ids, next_seq)
        except BaseException as error:
            opened.set_exception(error)
            return
        opened.set_result(connection)
        try:
            self._serve(connection)
        except BaseException as error:
            # A bug, not a failed write (those are reported per batch): never leave a
            # caller waiting on a writer that is gone.
            log.exception("sqlite store %s: the writer thread failed", self.path)
            with self._lock:
                self._failure = error
            self._fail_queued(self._unavailable())
        finally:
            connection.close()

    def _serve(self, connection: sqlite3.Connection) -> None:
        take = self._queue.get
        take_now = self._queue.get_nowait
        while True:
            timeout = (
                None if self._next_prune == math.inf else max(self._next_prune - self._clock(), 0)
            )
            try:
                items = [take(timeout=timeout)]
            except queue.Empty:
                self._prune_alone(connection)
                continue
            # Group commit: everything that arrived while the last commit ran.
            while True:
                try:
                    items.append(take_now())
                except queue.Empty:
                    break
            writes: list[_Write] = []
            for item in items:
                if isinstance(item, _Write):
                    writes.append(item)
                    continue
                if writes:
                    self._commit(connection, writes)
                    writes = []
                if isinstance(item, _Job):
                    _run_job(item, connection)
                elif item is _STOP:
                    # close() queues nothing after the stop.
                    return
            if writes:
                self._commit(connection, writes)

    def _commit(
        self, connection: sqlite3.Connection, writes: list[_Write], may_prune: bool = True
    ) -> None:
        """Make ``writes`` durable in one transaction and resolve their futures."""
        if self._next_prune == math.inf:
            self._next_prune = self._clock()
        # A chunk of pruning rides along with the group: it shares the group's fsync.
        prune = may_prune and self._clock() >= self._next_prune
        new_queues: list[str] = []
        pruned = (0, False)
        try:
            connection.execute("BEGIN IMMEDIATE")
            for write in writes:
                self._rows.apply(connection, write.batch, new_queues)
            if prune:
                pruned = self._prune(connection)
            connection.execute("COMMIT")
        except Exception as error:
            self._rollback(connection, new_queues)
            if prune:
                # Whatever failed, do not retry the pruning with every group.
                self._pruned(0, False)
            if len(writes) == 1 and not prune:
                self._resolve(writes, self._failed(error))
                return
            if len(writes) > 1:
                log.warning(
                    "sqlite store %s: a group of %d batches failed (%s); writing them one by one",
                    self.path,
                    len(writes),
                    describe(error),
                )
            # Retried without pruning, so a failure of the pruning fails no PUT.
            for write in writes:
                self._commit(connection, [write], may_prune=False)
            return
        self._rows.committed()
        self.commits += 1
        self.batches += len(writes)
        if prune:
            self._pruned(*pruned)
        self._resolve(writes, None)

    def _rollback(self, connection: sqlite3.Connection, new_queues: list[str]) -> None:
        # Queue ids handed out in the failed transaction do not exist in the file.
        self._rows.forget(new_queues)
        if connection.in_transaction:
            try:
                connection.execute("ROLLBACK")
            except sqlite3.Error as error:
                # SQLite may have rolled back on its own already (disk full, I/O error).
                log.warning("sqlite store %s: rollback failed: %s", self.path, describe(error))

    def _failed(self, error: Exception) -> StoreError:
        return StoreError(f"sqlite store {self.path}: write failed: {describe(error)}")

    def _resolve(self, writes: list[_Write], error: StoreError | None) -> None:
        """Complete the futures of ``writes`` on their loops, one wake-up per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for write in writes:
            by_loop.setdefault(write.future.get_loop(), []).append(write.future)
        for loop, futures in by_loop.items():
            # RuntimeError: that loop is closed, nobody is left to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle_futures, futures, error)

    def _prune(self, connection: sqlite3.Connection) -> tuple[int, bool]:
        """Delete the oldest history rows past the retention, at most one chunk.
        Returns how many, and whether a whole chunk went (more may be waiting)."""
        now = self._clock()
        return prune_history(connection, now - self.retention, self._prune_chunk, now)

    def _pruned(self, count: int, more: bool) -> None:
        """Account for a committed prune and schedule the next one."""
        self.pruned += count
        self._next_prune = self._clock() + (0.0 if more else self._prune_interval)

    def _prune_alone(self, connection: sqlite3.Connection) -> None:
        """Prune one chunk while there is nothing else to commit. In autocommit mode the
        DELETE is its own transaction, and a look that finds nothing writes nothing."""
        try:
            pruned = self._prune(connection)
        except Exception as error:
            self._rollback(connection, [])
            log.warning(
                "sqlite store %s: pruning the history failed: %s", self.path, describe(error)
            )
            pruned = (0, False)
        self._pruned(*pruned)

    def _recover(self, connection: sqlite3.Connection) -> RecoveredState:
        state = read_state(connection, self.path, self.retention)
        self._clock.resume(state.resume_at)
        # What expired while the broker was down goes first.
        self._next_prune = self._clock()
        return state

    def _fail_queued(self, error: StoreError) -> None:
        """Fail everything still queued (the writer is gone)."""
        writes: list[_Write] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Write):
                writes.append(item)
            elif isinstance(item, _Job):
                item.result.set_exception(error)
        self._resolve(writes, error)


def _run_job(job: _Job, connection: sqlite3.Connection) -> None:
    try:
        job.result.set_result(job.run(connection))
    except BaseException as error:
        job.result.set_exception(error)


__all__ = ["DEFAULT_SYNC", "SCHEMA_VERSION", "SYNC_MODES", "SqliteStore"]

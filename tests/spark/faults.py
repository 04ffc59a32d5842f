"""Code that runs inside Spark tasks to script faults: serializers that fail a task
attempt part-way through its partition, and leave marker files the test reads.

Spark pickles these into its Python workers; ``spark_helpers_by_value`` has
cloudpickle ship this module by value, so the workers need not import ``tests``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from holdfast.sdk.spark import row_to_json


class InjectedFailure(RuntimeError):
    """Raised on purpose by ``ScriptedSerializer`` to fail one task attempt."""


class ScriptedSerializer:
    """``row_to_json`` that also scripts faults, counting rows per task attempt.

    - in partition ``fail_partition``, attempt 0 raises ``InjectedFailure`` once it
      has serialized ``fail_after`` rows (so they were posted), after writing
      ``failed-p<partition>-a0`` with that count;
    - in partition ``signal_partition``, attempt 0 writes ``progress`` after
      ``signal_after`` rows, so the test can cut the network mid-job;
    - every attempt writes ``attempt-p<partition>-a<attempt>`` at its first row.
    """

    def __init__(
        self,
        marker_dir: str,
        fail_partition: int | None = None,
        fail_after: int = 0,
        signal_partition: int | None = None,
        signal_after: int = 0,
    ) -> None:
        self.marker_dir = marker_dir
        self.fail_partition = fail_partition
        self.fail_after = fail_after
        self.signal_partition = signal_partition
        self.signal_after = signal_after
        self._rows: dict[int, int] = {}  # by task attempt id: a worker may run many tasks

    def __call__(self, row: Any) -> bytes:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "ScriptedSerializer runs inside Spark tasks only"
        attempt_id = context.taskAttemptId()
        partition, attempt = context.partitionId(), context.attemptNumber()
        count = self._rows.get(attempt_id, 0) + 1
        self._rows[attempt_id] = count
        if count == 1:
            self._mark(f"attempt-p{partition}-a{attempt}", "")
        if attempt == 0 and partition == self.signal_partition and count == self.signal_after:
            self._mark("progress", str(count))
        if attempt == 0 and partition == self.fail_partition and count > self.fail_after:
            self._mark(f"failed-p{partition}-a0", str(count - 1))
            raise InjectedFailure(
                f"injected failure after {count - 1} rows of partition {partition}"
            )
        return row_to_json(row)

    def _mark(self, name: str, text: str) -> None:
        # Written to a temporary name and renamed, so a reader never sees half a file.
        path = Path(self.marker_dir) / name
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text)
        os.replace(temporary, path)


class FailingRows:
    """A ``mapPartitions`` function that passes rows through, except that attempt 0 of
    partition ``partition`` SIGKILLs its own Python worker after ``after`` rows (writing
    ``failed-p<partition>-a0`` with that count first): a task killed mid-write, which
    Spark retries."""

    def __init__(self, marker_dir: str, partition: int, after: int) -> None:
        self.marker_dir = marker_dir
        self.partition = partition
        self.after = after

    def __call__(self, rows: Any) -> Any:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "FailingRows runs inside Spark tasks only"
        doomed = context.partitionId() == self.partition and context.attemptNumber() == 0
        for count, row in enumerate(rows):
            if doomed and count == self.after:
                path = Path(self.marker_dir) / f"failed-p{self.partition}-a0"
                path.write_text(str(count))
                os.kill(os.getpid(), signal.SIGKILL)
            yield row


class LateFailure:
    """A ``mapPartitions`` function that passes rows through, except that in partition
    ``partition`` attempt 0 stalls ``stall`` seconds after ``after`` rows (the writer
    downstream has staged only the chunks it filled by then: ``stage.CHUNK_ROWS`` rows
    or ``CHUNK_BYTES``, so small rows may not be staged yet), writes
    ``failed-p<partition>-a0``, and raises; with
    ``every_attempt`` every attempt of that partition fails so (the job fails)."""

    def __init__(
        self, marker_dir: str, partition: int, after: int, stall: float, every_attempt: bool
    ) -> None:
        self.marker_dir = marker_dir
        self.partition = partition
        self.after = after
        self.stall = stall
        self.every_attempt = every_attempt

    def __call__(self, rows: Any) -> Any:
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "LateFailure runs inside Spark tasks only"
        attempt = context.attemptNumber()
        doomed = context.partitionId() == self.partition and (self.every_attempt or attempt == 0)
        for count, row in enumerate(rows):
            if doomed and count == self.after:
                # A scripted fault, not a wait for something: the retry must come later
                # than the broker's dedup window.
                time.sleep(self.stall)
                path = Path(self.marker_dir) / f"failed-p{self.partition}-a{attempt}"
                path.write_text(str(count))
                raise InjectedFailure(f"injected failure after {count} rows")
            yield row


class Straggler:
    """A ``mapPartitions`` function that passes rows through, except in partition
    ``partition``: a slow first attempt, for Spark to launch a speculative copy of.

    Attempt 0 stalls after ``after`` rows (writing ``stalled-p<partition>-a0`` with
    that count) until ``<marker_dir>/written`` exists (the driver's write returned) or
    ``stall`` seconds passed; if Spark has not killed it by then it writes
    ``resumed-p<partition>-a0`` and passes its remaining rows on.

    A later attempt (the copy) first waits, as long, until the broker's
    ``holdfast_broker_staged_rows`` gauge at ``staged_url`` exceeds ``staged_floor``
    (the rows the other partitions staged): until the original's writer has staged
    rows for the commit to discard. It writes ``attempt-p<partition>-a<attempt>`` with
    the gauge it saw, then passes every row on.
    """

    def __init__(
        self,
        marker_dir: str,
        partition: int,
        after: int,
        stall: float,
        staged_url: str,
        staged_floor: int,
    ) -> None:
        self.marker_dir = marker_dir
        self.partition = partition
        self.after = after
        self.stall = stall
        self.staged_url = staged_url
        self.staged_floor = staged_floor

    def __call__(self, rows: Any) -> Any:
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "Straggler runs inside Spark tasks only"
        attempt = context.attemptNumber()
        mine = context.partitionId() == self.partition
        marker_dir = Path(self.marker_dir)
        deadline = time.monotonic() + self.stall
        if mine and attempt > 0:
            staged = self._staged()
            while staged <= self.staged_floor and time.monotonic() < deadline:
                time.sleep(0.05)
                staged = self._staged()
            (marker_dir / f"attempt-p{self.partition}-a{attempt}").write_text(str(staged))
        for count, row in enumerate(rows):
            if mine and attempt == 0 and count == self.after:
                (marker_dir / f"stalled-p{self.partition}-a0").write_text(str(count))
                # A scripted slow task: it holds its rows until the job is done without
                # it, so the copy is the attempt that commits.
                while not (marker_dir / "written").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                (marker_dir / f"resumed-p{self.partition}-a0").write_text("")
            yield row

    def _staged(self) -> int:
        import urllib.request

        with urllib.request.urlopen(self.staged_url, timeout=5) as response:
            text: str = response.read().decode()
        for line in text.splitlines():
            if line.startswith("holdfast_broker_staged_rows "):
                return int(float(line.split()[1]))
        raise AssertionError(f"no holdfast_broker_staged_rows at {self.staged_url}")

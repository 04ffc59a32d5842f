"""Shared pieces of the benchmark: servers as subprocesses, statistics, the table.

The broker and the proxy run as real subprocesses (``python -m holdfast.broker``,
``python -m holdfast.proxy``) through the test suite's ``BrokerProcess`` and
``ProxyProcess``, on free ports of 127.0.0.1, and are stopped by PID however a
measurement ends.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
"""The repository root (``bench/..``)."""

# The process helpers live with the tests; the repository root makes them importable.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.processes import BrokerProcess, ProxyProcess  # noqa: E402

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
"""The ``asctime`` that starts every line the broker and the proxy log."""


@dataclass(frozen=True)
class Store:
    """A broker store configuration: its label and its command-line arguments."""

    label: str
    args: tuple[str, ...]


def memory_store() -> Store:
    """The in-memory store."""
    return Store("memory", ("--store", "memory"))


def sqlite_store(directory: str) -> Store:
    """The durable sqlite store with an fsync on every commit, in ``directory``."""
    path = os.path.join(directory, f"bench-{time.monotonic_ns()}.db")
    return Store("sqlite", ("--store", f"sqlite:{path}", "--sync", "full"))


@contextlib.contextmanager
def running_broker(store: Store) -> Iterator[BrokerProcess]:
    """A broker subprocess on a free port, stopped (SIGTERM, then SIGKILL) on exit."""
    broker = BrokerProcess(list(store.args))
    try:
        broker.start()
        yield broker
    finally:
        stop_server(broker)


@contextlib.contextmanager
def running_proxy(upstream: str) -> Iterator[ProxyProcess]:
    """A proxy subprocess on a free port in front of ``upstream``, stopped on exit."""
    proxy = ProxyProcess(["--upstream", upstream])
    try:
        proxy.start()
        yield proxy
    finally:
        stop_server(proxy)


def stop_server(server: BrokerProcess | ProxyProcess) -> None:
    """Stop a server by PID however it is (running, frozen by SIGSTOP, gone)."""
    if not server.running:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(server.pid, signal.SIGCONT)  # a SIGSTOPped server cannot act on SIGTERM
    server.close()


class ScriptServer:
    """A bench script run as a server subprocess (``python bench/<script> ...``) that
    prints ``listening on HOST:PORT`` to stderr when ready; stopped by PID."""

    def __init__(self, script: str, args: Sequence[str] = ()) -> None:
        self.command = [sys.executable, str(REPO / "bench" / script), *args]
        self.address = ""
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ScriptServer:
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        ready = threading.Event()
        lines: list[str] = []

        def read(stream: Any) -> None:
            for line in stream:
                lines.append(line)
                match = re.search(r"listening on (\S+:\d+)", line)
                if match and not ready.is_set():
                    self.address = match[1]
                    ready.set()

        threading.Thread(target=read, args=(self._proc.stderr,), daemon=True).start()
        deadline = time.monotonic() + 20
        while not ready.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"{self.command} did not start:\n{''.join(lines)}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


def temp_dir() -> tempfile.TemporaryDirectory[str]:
    """A temporary directory for sqlite stores, removed afterwards."""
    return tempfile.TemporaryDirectory(prefix="holdfast-bench-")


def log_time(line: str) -> float | None:
    """The wall-clock time (``time.time()`` scale) a broker or proxy log line was written."""
    match = LOG_TIME.match(line)
    if match is None:
        return None
    stamp = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()  # naive: local time, like logging's asctime


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, nearest rank; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def read_statm_rss() -> int:
    """This process's resident set size in bytes, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Row:
    """One line of a printed table."""

    cells: list[str]
    verdict: str = ""


@dataclass
class Table:
    """A titled table printed with aligned columns."""

    title: str
    header: list[str]
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object, verdict: str = "") -> None:
        """Append a row; cells are formatted with ``str``."""
        self.rows.append(Row([str(cell) for cell in cells], verdict))


def print_table(table: Table) -> None:
    """Print ``table`` to stdout with aligned columns, then its notes."""
    header = [*table.header, ""] if any(r.verdict for r in table.rows) else table.header
    lines = [[*r.cells, r.verdict] if len(header) > len(r.cells) else r.cells for r in table.rows]
    widths = [len(h) for h in header]
    for cells in lines:
        for i, cell in enumerate(cells):
            widths[i] = max(widths[i], len(cell))

    def fmt(cells: list[str]) -> str:
        parts = [
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    print()
    print(f"== {table.title}")
    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    for cells in lines:
        print(fmt(cells))
    for note in table.notes:
        print(f"   {note}")
    sys.stdout.flush()


def rate(value: float) -> str:
    """A rate in messages per second, e.g. ``98.2k``."""
    if math.isnan(value):
        return "n/a"
    if value >= 10_000:
        return f"{value / 1000:.1f}k"
    return f"{value:.0f}"


def millis(seconds: float) -> str:
    """Seconds as milliseconds with one decimal."""
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def verdict(ok: bool) -> str:
    """``PASS`` or ``MISS`` (these are figures, not tests)."""
    return "PASS" if ok else "MISS"


def now() -> float:
    """Monotonic seconds (all in-process durations use this clock)."""
    return time.perf_counter()

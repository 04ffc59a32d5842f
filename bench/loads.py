"""The SDK loads: PUT->ACK (one producer), PUSH->CONFIRM (one consumer), idle round trips.

Each load uses ``holdfast.sdk.Session`` the way an application does (default
options, the queue's ``on_ack`` callback, ``message.confirm()`` in ``on_message``),
and also reports how much CPU each process spent per message, read from
``/proc/<pid>/stat``, so a missed target points at the process that is busy.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import harness

import holdfast.sdk.driver.core as driver_module
from holdfast.sdk import Ack, AckStatus, Message, Session, aio

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds used so far by process ``pid`` (this one if None)."""
    if pid is None:
        return time.process_time()
    with open(f"/proc/{pid}/stat") as stat:
        # The command name may hold spaces; the fields we want follow its ')'.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds all processes of the machine have used (``/proc/stat``, every core)."""
    with open("/proc/stat") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / CLOCK_TICKS


@dataclass
class CpuMeter:
    """CPU seconds spent by the bench (client) process and by server PIDs over a block,
    and by everything else on the machine (other load distorts the figures)."""

    pids: dict[str, int]
    used: dict[str, float] = field(default_factory=dict)
    others_cores: float = 0.0
    """Cores' worth of CPU other processes used meanwhile (0 on a quiet machine)."""

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Measure the CPU used inside the ``with`` block."""
        start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        client = cpu_seconds()
        busy = machine_busy_seconds()
        wall = time.perf_counter()
        try:
            yield
        finally:
            self.used = {"client": cpu_seconds() - client}
            for name, pid in self.pids.items():
                try:
                    self.used[name] = cpu_seconds(pid) - start[name]
                except OSError:
                    self.used[name] = float("nan")
            others = machine_busy_seconds() - busy - sum(self.used.values())
            self.others_cores = max(0.0, others) / max(1e-9, time.perf_counter() - wall)

    def per_message_us(self, count: int) -> dict[str, float]:
        """Microseconds of CPU per message, by process."""
        return {name: seconds / count * 1e6 for name, seconds in self.used.items()}


def _put_count(batch: Any) -> int:
    """PUTs in a PutBatch: 16 bytes of GUID each (protocol 2), or one ``Put`` each (1,
    measured as the baseline by ``bench/columnar.py``)."""
    rows = getattr(batch, "puts", None)
    return len(rows) if rows is not None else len(batch.guids) // 16


class PutFrameCounter:
    """Counts the PutBatch frames the SDK sends (and the PUTs in them) while active,
    by wrapping the ``encode`` function the session driver's writer calls."""

    def __init__(self) -> None:
        self.frames = 0
        self.puts = 0
        self._original: Callable[..., Any] | None = None

    @property
    def mean_batch(self) -> float:
        """PUTs per PutBatch frame (NaN if none was counted)."""
        return self.puts / self.frames if self.frames else float("nan")

    def __enter__(self) -> PutFrameCounter:
        original = getattr(driver_module, "encode", None)
        if original is None:  # the SDK changed shape: no count rather than no bench
            return self
        self._original = original

        def counting(*args: Any) -> Any:
            for frame, nbytes in original(*args):
                if frame.WhichOneof("frame") == "puts":
                    self.frames += 1
                    self.puts += _put_count(frame.puts)
                yield frame, nbytes

        driver_module.encode = counting  # type: ignore[attr-defined,assignment]
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._original is not None:
            driver_module.encode = self._original  # type: ignore[attr-defined]


@dataclass
class ProduceResult:
    """What one producer run measured."""

    count: int
    size: int
    seconds: float
    """From the first ``post()`` to the last ``on_ack``."""
    rate: float
    p50: float
    p99: float
    """``post()`` to ``on_ack`` latency percentiles, in seconds, over every message."""
    not_success: int
    """PUTs whose ACK was not SUCCESS, or that got no ACK in time."""
    mean_batch: float
    """PUTs per PutBatch frame the SDK sent."""
    cpu_us: dict[str, float]
    """CPU microseconds per message, by process."""
    others_cores: float
    """Cores' worth of CPU used by other processes of the machine during the run."""


@dataclass
class ConsumeResult:
    """What one consumer run measured."""

    count: int
    size: int
    seconds: float
    """From ``open_queue()`` to the last message confirmed."""
    rate: float
    received: int
    cpu_us: dict[str, float]
    others_cores: float


class _AckTally:
    """What a producer run saw of its ACKs: per-message latency (``post()`` call to
    ``on_ack``), successes, and when the last came. Only what is in flight is kept
    (like an application tracking its PUTs), by the GUID's int, and latencies are
    plain floats: objects the garbage collector does not track, so the bench adds no
    GC work of its own to the SDK's."""

    def __init__(self, count: int, done: Callable[[], None]) -> None:
        self.count = count
        self.sent: dict[int, float] = {}
        self.early: dict[int, float] = {}
        self.latencies: list[float] = []
        self.acked = 0
        self.ok = 0
        self.last = 0.0
        self._done = done

    def on_ack(self, ack: Ack) -> None:
        """The queue's ``on_ack``."""
        at = time.perf_counter()
        posted_at = self.sent.pop(ack.guid.int, None)
        if posted_at is None:  # on_ack ran before post() returned to the posting loop
            self.early[ack.guid.int] = at
        else:
            self.latencies.append(at - posted_at)
        self.acked += 1
        self.ok += ack.status is AckStatus.SUCCESS
        if self.acked == self.count:
            self.last = at
            self._done()

    def result(
        self, size: int, started: float, frames: PutFrameCounter, cpu: CpuMeter
    ) -> ProduceResult:
        """The run's figures (``last`` set by the caller if not every ACK came)."""
        for guid, at in self.early.items():
            self.latencies.append(at - self.sent.pop(guid))
        seconds = self.last - started
        return ProduceResult(
            count=self.count,
            size=size,
            seconds=seconds,
            rate=self.acked / seconds if seconds > 0 else float("nan"),
            p50=harness.percentile(self.latencies, 50),
            p99=harness.percentile(self.latencies, 99),
            not_success=self.count - self.ok,
            mean_batch=frames.mean_batch,
            cpu_us=cpu.per_message_us(self.count),
            others_cores=cpu.others_cores,
        )


def produce(
    address: str,
    uri: str,
    count: int,
    size: int,
    cpu: CpuMeter,
    timeout: float = 120.0,
    batch: int = 1,
    properties: Mapping[str, str] | None = None,
) -> ProduceResult:
    """Post ``count`` messages of ``size`` bytes (each with ``properties``) as fast as
    ``post()`` takes them and wait for every ACK; per-message latency is ``post()`` call
    to ``on_ack``. With ``batch`` > 1, ``post_many()`` takes ``batch`` messages a call
    (a bulk producer)."""
    payload = os.urandom(size)
    clock = time.perf_counter
    done = threading.Event()
    tally = _AckTally(count, done.set)
    sent = tally.sent
    with Session(address, on_event=_quiet) as session:
        queue = session.open_queue(uri, write=True, on_ack=tally.on_ack)
        post = queue.post
        payloads = [payload] * batch
        with PutFrameCounter() as frames, cpu.measure():
            started = clock()
            if batch == 1:
                for _ in range(count):
                    posted_at = clock()
                    sent[post(payload, properties).int] = posted_at
            else:
                for _ in range(count // batch):
                    posted_at = clock()
                    for made in queue.post_many(payloads, properties):
                        sent[made.int] = posted_at
            if not done.wait(timeout):
                tally.last = clock()
    return tally.result(size, started, frames, cpu)


def produce_async(
    address: str,
    uri: str,
    count: int,
    size: int,
    cpu: CpuMeter,
    timeout: float = 120.0,
) -> ProduceResult:
    """``produce`` with the asyncio API (``holdfast.sdk.aio``): ``await queue.post()``
    as fast as it returns, the queue's ``on_ack`` on the loop; the same figures. The
    like of nats.py's ``await js.publish_async()`` that ``natsload`` measures."""
    return asyncio.run(_produce_async(address, uri, count, size, cpu, timeout))


async def _produce_async(
    address: str, uri: str, count: int, size: int, cpu: CpuMeter, timeout: float
) -> ProduceResult:
    payload = os.urandom(size)
    clock = time.perf_counter
    done = asyncio.Event()
    tally = _AckTally(count, done.set)
    sent = tally.sent
    async with aio.Session(address, on_event=_quiet) as session:
        queue = await session.open_queue(uri, write=True, on_ack=tally.on_ack)
        post = queue.post
        with PutFrameCounter() as frames, cpu.measure():
            started = clock()
            for _ in range(count):
                posted_at = clock()
                sent[(await post(payload)).int] = posted_at
            try:
                await asyncio.wait_for(done.wait(), timeout)
            except TimeoutError:
                tally.last = clock()
    return tally.result(size, started, frames, cpu)


def consume(
    address: str,
    uri: str,
    count: int,
    size: int,
    cpu: CpuMeter,
    timeout: float = 120.0,
) -> ConsumeResult:
    """Open ``uri`` for reading (default flow limits) and confirm every message as it
    arrives; time from the open until ``count`` messages are confirmed."""
    received = 0
    done = threading.Event()
    finished = [0.0]
    clock = time.perf_counter

    def on_message(message: Message) -> None:
        nonlocal received
        message.confirm()
        received += 1
        if received == count:
            finished[0] = clock()
            done.set()

    with Session(address, on_event=_quiet) as session, cpu.measure():
        started = clock()
        session.open_queue(uri, read=True, on_message=on_message)
        if not done.wait(timeout):
            finished[0] = clock()
    seconds = finished[0] - started
    return ConsumeResult(
        count=count,
        size=size,
        seconds=seconds,
        rate=received / seconds if seconds > 0 else float("nan"),
        received=received,
        cpu_us=cpu.per_message_us(count),
        others_cores=cpu.others_cores,
    )


def idle_round_trips(address: str, uri: str, count: int, size: int) -> list[float]:
    """Post one message at a time and wait for its ACK: ``post()`` to ``on_ack``
    latencies of an otherwise idle link, in seconds."""
    payload = os.urandom(size)
    acked = threading.Event()
    at = [0.0]
    latencies: list[float] = []
    clock = time.perf_counter

    def on_ack(ack: Ack) -> None:
        at[0] = clock()
        acked.set()

    with Session(address, on_event=_quiet) as session:
        queue = session.open_queue(uri, write=True, on_ack=on_ack)
        for _ in range(count):
            acked.clear()
            started = clock()
            queue.post(payload)
            if not acked.wait(10):
                break
            latencies.append(at[0] - started)
    return latencies


def _quiet(event: object) -> None:
    """Session events are not part of these figures (recovery measures them)."""

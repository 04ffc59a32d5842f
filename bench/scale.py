"""Issue #20's growth curves and the Redis store's figures, for ``make bench``.

- sessions through one proxy (1, 10, 100, 300 asyncio sessions in one process, each
  posting its share, at least ``PER_SESSION``, and flushing): total PUT->ACK msg/s and
  its ratio to one session,
  the proxy's and broker's CPU per message, and the bench client's;
- open queues (1, 100, 10k on one session, posting round-robin over them): msg/s,
  the broker's CPU per message and the bench client's;

Both curves are the median of ``ROUNDS`` rounds (see there).
- queue depth: PUT->ACK with 0 and with ``depth`` unconsumed messages held, and the
  broker's resident memory per queued 100-B message (``/proc/PID/statm``);
- payload size (100 B, 10 KiB, 1 MiB): msg/s and MB/s;
- the Redis store: PUT->ACK for one node, for two nodes on one Redis (a producer
  process on each, one queue), and Redis commands per message
  (``bench/redisscale.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import harness
import loads

from holdfast.sdk import Session
from holdfast.sdk import aio as hf_aio

SESSIONS = (1, 10, 100, 300)
PER_SESSION = 1000
"""Messages each session posts at least, whatever ``total`` says: a PUT frame holds
up to 1,000, so a session posting fewer never leaves its start-up (its first frame,
its flush) and the curve measured that, not sessions. With 60k messages over 300
sessions (200 each) the client's CPU per message rose 5 -> 6-10 us and the rate
fell to 0.7x; with 1,000 each, CPU per message of every hop stayed within 10 % of
one session's (2026-11-26, 2 cores)."""
QUEUES = (1, 100, 10_000)
PAYLOADS = (100, 10 * 1024, 1024 * 1024)


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _sessions_run(
    address: str, sessions: int, total: int, size: int, meter: loads.CpuMeter
) -> tuple[float, int]:
    """Open every session and queue first, then time (and meter) posting and flushing
    only; (msg/s, messages posted)."""
    payload = os.urandom(size)
    per = max(1, total // sessions)
    opened = [hf_aio.Session(address) for _ in range(sessions)]
    try:
        for session in opened:
            await session.__aenter__()
        queues = await asyncio.gather(
            *(
                session.open_queue(f"hf://scale/s{sessions}-{index}", write=True)
                for index, session in enumerate(opened)
            )
        )

        async def post(session: hf_aio.Session, queue: Any) -> None:
            for _ in range(per):
                await queue.post(payload)
            assert await session.flush(120)

        with meter.measure():
            started = time.perf_counter()
            await asyncio.gather(*(post(s, q) for s, q in zip(opened, queues, strict=True)))
            seconds = time.perf_counter() - started
        return per * sessions / seconds, per * sessions
    finally:
        for session in opened:
            await session.close()


ROUNDS = 3
"""Each curve point is measured once per round, the points interleaved within a round
so that other load on the machine spreads over all of them; the median is reported.
One 60k-message sample of one point varied by 2x between runs on the 2-core machine."""


class Sample(NamedTuple):
    """One curve point measured once."""

    rate: float
    """Messages per second, wall clock."""
    server_us: float
    """CPU microseconds per message of the server processes together."""
    client_us: float
    """CPU microseconds per message of the bench process (SDK and load loop)."""


def _median_rows(key: str, samples: dict[int, list[Sample]]) -> list[dict[str, Any]]:
    """One row per point: the median rate and the median CPU per message of the
    servers and of the bench client."""
    return [
        {
            key: point,
            "rate": harness.median([run.rate for run in runs]),
            "server_us": harness.median([run.server_us for run in runs]),
            "client_us": harness.median([run.client_us for run in runs]),
            "rates": [run.rate for run in runs],
        }
        for point, runs in samples.items()
    ]


def _sample(rate: float, meter: loads.CpuMeter, count: int) -> Sample:
    """The rate with the CPU microseconds per message of the server processes and,
    apart, of the bench client (whose share grows with the sessions it hosts)."""
    used = meter.per_message_us(count)
    servers = sum(value for name, value in used.items() if name != "client")
    return Sample(rate, servers, used["client"])


def sessions_curve(total: int, rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """PUT->ACK msg/s through one proxy for each session count (median of ``rounds``),
    the proxy's and broker's CPU per message, and the bench client's."""
    samples: dict[int, list[Sample]] = {count: [] for count in SESSIONS}
    for _ in range(rounds):
        with (
            harness.running_broker(harness.memory_store()) as broker,
            harness.running_proxy(broker.address) as proxy,
        ):
            for count in SESSIONS:
                meter = loads.CpuMeter({"proxy": proxy.pid, "broker": broker.pid})
                messages = max(total, PER_SESSION * count)
                rate, posted = asyncio.run(
                    _sessions_run(proxy.address, count, messages, 100, meter)
                )
                samples[count].append(_sample(rate, meter, posted))
    return _median_rows("sessions", samples)


def queues_curve(total: int, rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """PUT->ACK msg/s of one session posting round-robin over N open queues (median of
    ``rounds``), the broker's CPU per message, and the bench client's."""
    payload = os.urandom(100)
    # 10k queues on one session is past the default per-session limits: raised here.
    limits = ("--max-open-queues", "20000", "--new-queues-per-minute", "100000")
    store = harness.Store("memory", (*harness.memory_store().args, *limits))
    samples: dict[int, list[Sample]] = {count: [] for count in QUEUES}
    for _ in range(rounds):
        with harness.running_broker(store) as broker:
            for count in QUEUES:
                with Session(broker.address) as session:
                    queues = [
                        session.open_queue(f"hf://scale/q{count}-{i}", write=True)
                        for i in range(count)
                    ]
                    meter = loads.CpuMeter({"broker": broker.pid})
                    with meter.measure():
                        started = time.perf_counter()
                        for i in range(total):
                            queues[i % count].post(payload)
                        assert session.flush(180)
                        seconds = time.perf_counter() - started
                    samples[count].append(_sample(total / seconds, meter, total))
    return _median_rows("queues", samples)


def depth_and_memory(depth: int, probe: int) -> dict[str, Any]:
    """PUT->ACK with an empty queue and with ``depth`` messages held; broker bytes per
    queued 100-B message, over the first quarter of the fill and over the rest (memory
    that grows linearly with what is held costs the same per message in both)."""
    first = depth // 4
    with harness.running_broker(harness.memory_store()) as broker:
        empty = loads.produce(broker.address, "hf://scale/probe0", probe, 100, loads.CpuMeter({}))
        before = _rss(broker.pid)
        filled = loads.produce(broker.address, "hf://scale/deep", first, 100, loads.CpuMeter({}))
        quarter = _rss(broker.pid)
        loads.produce(broker.address, "hf://scale/deep", depth - first, 100, loads.CpuMeter({}))
        after = _rss(broker.pid)
        deep = loads.produce(broker.address, "hf://scale/deep", probe, 100, loads.CpuMeter({}))
    return {
        "depth": depth,
        "empty_rate": empty.rate,
        "fill_rate": filled.rate,
        "deep_rate": deep.rate,
        "bytes_per_message": (after - before) / depth,
        "first_quarter": first,
        "bytes_first_quarter": (quarter - before) / first,
        "bytes_rest": (after - quarter) / (depth - first),
    }


def payload_curve(bytes_per_size: int) -> list[dict[str, Any]]:
    """PUT->ACK msg/s and MB/s per payload size (about ``bytes_per_size`` bytes each)."""
    rows = []
    with harness.running_broker(harness.memory_store()) as broker:
        for size in PAYLOADS:
            count = max(50, min(100_000, bytes_per_size // size))
            result = loads.produce(
                broker.address, f"hf://scale/p{size}", count, size, loads.CpuMeter({})
            )
            rows.append(
                {
                    "size": size,
                    "count": count,
                    "rate": result.rate,
                    "mb_s": result.rate * size / 1e6,
                }
            )
    return rows


def redis_figures(count: int) -> dict[str, Any]:
    """The Redis store: one node against two on one Redis (``bench/redisscale.py``)."""
    import redisscale  # here: bench/columnar.py imports this module against older trees

    return redisscale.measure(count)


def run_all(
    args: argparse.Namespace,
    failures: list[str],
    guarded: Callable[..., Any],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Issue #20's curves and the Redis store, each section guarded (a failure is noted
    in ``failures`` and the rest goes on)."""
    scale_results: dict[str, Any] = {}
    no_rows: list[dict[str, Any]] = []
    no_result: dict[str, Any] = {}
    if args.scale_count:
        progress("sessions through one proxy: 1, 10, 100, 300")
        scale_results["sessions"] = guarded(
            "sessions", failures, lambda: sessions_curve(args.scale_count), no_rows
        )
        progress("open queues: 1, 100, 10k")
        scale_results["queues"] = guarded(
            "queues", failures, lambda: queues_curve(args.scale_count), no_rows
        )
        progress(f"queue depth: {args.depth} held")
        scale_results["depth"] = guarded(
            "depth",
            failures,
            lambda: depth_and_memory(args.depth, args.scale_count),
            no_result,
        )
        progress("payload sizes: 100 B, 10 KiB, 1 MiB")
        scale_results["payloads"] = guarded(
            "payloads", failures, lambda: payload_curve(200 * 1024 * 1024), no_rows
        )
    if args.redis_count:
        progress("Redis store: one node, two nodes")
        scale_results["redis"] = guarded(
            "redis", failures, lambda: redis_figures(args.redis_count), no_result
        )
        progress("Redis node lease at 1, 4,000 and 100,000 open queues")
        # Imported here: bench/columnar.py imports this module against an older tree
        # (its "before"), which may not have the Redis modules the lease bench needs.
        import heartbeat

        scale_results["heartbeat"] = guarded(
            "heartbeat", failures, heartbeat.heartbeat_figures, no_rows
        )
    return scale_results


__all__ = [
    "depth_and_memory",
    "payload_curve",
    "queues_curve",
    "redis_figures",
    "run_all",
    "sessions_curve",
]

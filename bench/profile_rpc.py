"""Where a request/reply call spends its CPU, per process, through the proxy.

    .venv/bin/python bench/profile_rpc.py [--aio] [--direct] [--count N] [--window N]

Starts a broker (memory store), a proxy and ``rpcload.WORKERS`` echo workers (the
shape of ``make bench``), makes ``count`` pipelined calls with ``window`` in flight
from this process, and prints each process's CPU seconds (user + system, from
``/proc/<pid>/stat``) per call, and the garbage collector's time in the caller.
``--direct``: the caller and the workers go straight to the broker (the proxy idles).
``bench/PROFILE.md`` has runs and what they mean.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import threading
import time
from concurrent.futures import Future
from typing import Any

import harness
import rpcload

from holdfast.sdk import Session, aio


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class GcTimer:
    """Wall time this process spends in garbage collections, and how many of each."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1


def threaded_calls(address: str, uri: str, count: int, window: int) -> None:
    """``count`` calls through ``request_async``, ``window`` in flight."""
    with Session(address) as session:
        for _ in range(200):
            session.request(uri, rpcload.PAYLOAD, timeout=60)
        slots = threading.Semaphore(window)
        done = threading.Event()
        left = [count]
        lock = threading.Lock()

        def finished(future: Future[Any]) -> None:
            future.result()
            slots.release()
            with lock:
                left[0] -= 1
                if not left[0]:
                    done.set()

        for _ in range(count):
            slots.acquire()
            session.request_async(uri, rpcload.PAYLOAD, timeout=60).add_done_callback(finished)
        if not done.wait(300):
            raise RuntimeError("calls did not complete within 300 s")


async def aio_calls(address: str, uri: str, count: int, window: int) -> None:
    """``count`` calls on the asyncio session, from ``window`` coroutines."""
    async with aio.Session(address) as session:
        for _ in range(200):
            await session.request(uri, rpcload.PAYLOAD, timeout=60)
        left = [count]

        async def lane() -> None:
            while left[0] > 0:
                left[0] -= 1
                await session.request(uri, rpcload.PAYLOAD, timeout=60)

        await asyncio.gather(*(lane() for _ in range(window)))


def main() -> None:
    """Measure one flavour and print CPU per call per process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aio", action="store_true", help="the asyncio caller and workers")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=rpcload.WINDOW)
    parser.add_argument(
        "--direct", action="store_true", help="caller and workers straight to the broker"
    )
    args = parser.parse_args()
    uri = "hf://bench/rpc-profile"
    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
        contextlib.ExitStack() as workers,
    ):
        pids = {"caller": os.getpid(), "proxy": proxy.pid, "broker": broker.pid}
        address = broker.address if args.direct else proxy.address
        for index in range(rpcload.WORKERS):
            worker = rpcload._worker(address, uri, 64 if args.aio else 8, args.aio)
            workers.enter_context(worker)
            assert worker._proc is not None
            pids[f"worker {index}"] = worker._proc.pid
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        collector = GcTimer()
        started = time.perf_counter()
        if args.aio:
            asyncio.run(aio_calls(address, uri, args.count, args.window))
        else:
            threaded_calls(address, uri, args.count, args.window)
        elapsed = time.perf_counter() - started
        spent = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    print(f"{args.count / elapsed:,.0f} calls/s ({'asyncio' if args.aio else 'threaded'})")
    for name, seconds in spent.items():
        print(f"  {name:9s} {seconds / args.count * 1e6:6.1f} µs CPU a call")
    total = sum(spent.values())
    print(f"  total     {total / args.count * 1e6:6.1f} µs a call, {total / elapsed:.2f} cores")
    print(f"  caller GC {collector.seconds:.2f} s, collections {collector.collections}")


if __name__ == "__main__":
    main()

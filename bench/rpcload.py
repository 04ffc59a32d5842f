"""Request/reply figures, beside a plain gRPC unary call on the same machine.

As a script it is one of the servers the measurement needs::

    python bench/rpcload.py unary --listen 127.0.0.1:0      # logs "listening on HOST:PORT"
    python bench/rpcload.py worker ADDRESS URI --concurrency 8 [--aio]  # prints "ready"

``measure`` starts a broker, a proxy, ``WORKERS`` worker processes (8 threads each,
or 64 tasks for the asyncio worker) and the unary server; one caller (this process)
and the workers go through the proxy, once with the threaded ``Session``/``Worker``
and once with the asyncio ones (``holdfast.sdk.aio``). For each it times
``sequential`` calls one at a time (the p50/p99 round trip of one call at low load,
and their rate) and ``count`` pipelined calls with ``window`` in flight (calls/s):
``request_async`` futures for the threaded caller, ``window`` coroutines each
awaiting one call after another for the asyncio one. The payload is 100 bytes,
echoed back.

The baseline, measured first in the same run: #35's old shape, the threaded
caller with one worker process (8 threads) and 64 calls in flight, as the issue
measured its 1.9k calls/s (``BEFORE``), run by the tree as the issue was filed
(``RPC_BEFORE``, extracted with ``git archive`` and imported by a child process and
the servers it starts), then by this tree. The 5x target divides the best pipelined
4-worker rate through the proxy by the first row's rate; its one-at-a-time rate is
printed beside it too (``sequential_rate``).

    python bench/rpcload.py [--count N] [--window N]   # measure; prints one dict a row
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import harness
from echo import serve_raw

from holdfast.sdk import Request, Session, Worker, aio

METHOD = "/holdfast.bench.Unary/Echo"
PAYLOAD = bytes(100)
WORKERS = 4
"""Worker processes serving the measured calls."""
WINDOW = 2048
"""Calls in flight from the one caller (pipelined)."""
BEFORE = 1900.0
"""Calls/s through the proxy before issue #35 (threaded caller, one worker)."""
BEFORE_WINDOW = 64
"""Calls in flight in the measurement of ``BEFORE`` (one worker)."""
TARGET = 10_000.0
"""Calls/s through the proxy the issue asks for (1 caller, 4 workers)."""
RPC_BEFORE = "ea953de"
"""The tree as issue #35 was filed (the parent of its first commit, replies by id),
whose 1.9k calls/s the issue measured: ``measure`` runs its old shape again, from that
tree, in the same run."""


@dataclass
class CallFigures:
    """One way of calling: its rate with a window of calls in flight, and its latencies."""

    name: str
    rate: float
    p50: float
    p99: float
    count: int
    window: int
    sequential: int
    workers: int = 1
    sequential_rate: float = 0.0
    """Calls/s of the ``sequential`` calls, one at a time."""


def _time_calls(
    call_async: Callable[[], Future[Any]], call: Callable[[], object], count: int, window: int
) -> tuple[float, list[float]]:
    latencies = []
    for _ in range(max(20, count // 20)):  # warm-up: connections, queues, caches
        call()
    for _ in range(min(count // 10, 1000)):
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    slots = threading.Semaphore(window)
    done = threading.Event()
    remaining = [count]
    lock = threading.Lock()

    def finished(future: Future[Any]) -> None:
        future.result()  # an error fails the bench loudly, not a silent figure
        slots.release()
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()

    started = time.perf_counter()
    for _ in range(count):
        slots.acquire()
        call_async().add_done_callback(finished)
    if not done.wait(300):
        raise RuntimeError("calls did not complete within 300 s")
    return count / (time.perf_counter() - started), latencies


def measure_tree(ref: str, count: int, window: int = BEFORE_WINDOW) -> CallFigures:
    """#35's old shape (the threaded caller, one worker of 8 threads, 64 in flight,
    through the proxy) run by the tree at ``ref``: a child process imports that tree
    (``columnar.baseline_tree``), and so do the broker, proxy and worker it starts."""
    import columnar  # the bench's own module: the tree extraction and its environment

    with tempfile.TemporaryDirectory(prefix="holdfast-rpc-before-") as directory:
        links = columnar.baseline_tree(ref, Path(directory))
        args = ["--count", str(count), "--window", str(window), "before"]
        result = columnar.run_in_tree(links, __file__, args, 900)
    if "error" in result:
        raise RuntimeError(f"the {ref} tree's run failed: {result['error']}")
    figures = CallFigures(**result)
    figures.name = f"request/reply threaded, SDK->proxy->broker, #35's old shape, tree {ref}"
    return figures


def _old_shape(count: int, window: int) -> CallFigures:
    """#35's old shape on whatever tree this process imports (``before``)."""
    uri = "hf://bench/rpc-before"
    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
        _worker(proxy.address, uri, 8),
    ):
        rate, latencies = _measure_threaded(proxy.address, uri, count, window)
    return _figures("old shape", rate, latencies, count, window, 1)


def measure(
    count: int = 20_000, window: int = WINDOW, baseline_ref: str | None = RPC_BEFORE
) -> list[CallFigures]:
    """Request/reply through the proxy (threaded and asyncio), and the plain gRPC
    unary call, in one run; the first row is the baseline: #35's old shape run by the
    tree as the issue was filed (``baseline_ref``; if that run fails, or with None,
    by this tree, which is the second row in any case)."""
    results: list[CallFigures] = []
    if baseline_ref:
        try:
            results.append(measure_tree(baseline_ref, count // 4, min(BEFORE_WINDOW, window)))
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            print(f"rpcload: no baseline row from {baseline_ref}: {error}", file=sys.stderr)
    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
    ):
        with _worker(proxy.address, "hf://bench/rpc-before", 8):
            rate, latencies = _measure_threaded(
                proxy.address, "hf://bench/rpc-before", count // 4, min(BEFORE_WINDOW, window)
            )
        name = "request/reply threaded, SDK->proxy->broker, #35's old shape, this tree"
        results.append(_figures(name, rate, latencies, count // 4, min(BEFORE_WINDOW, window), 1))
        for flavour in ("threaded", "asyncio"):
            uri = f"hf://bench/rpc-{flavour}"
            with contextlib.ExitStack() as workers:
                aio = flavour == "asyncio"
                for _ in range(WORKERS):
                    # 8 threads; 64 tasks on a loop cost nothing and hold more requests
                    workers.enter_context(_worker(proxy.address, uri, 64 if aio else 8, aio))
                if flavour == "threaded":
                    rate, latencies = _measure_threaded(proxy.address, uri, count, window)
                else:
                    rate, latencies = asyncio.run(_measure_aio(proxy.address, uri, count, window))
            name = f"request/reply {flavour}, SDK->proxy->broker"
            results.append(_figures(name, rate, latencies, count, window, WORKERS))
        uri = "hf://bench/rpc-direct"
        with contextlib.ExitStack() as workers:
            for _ in range(WORKERS):
                workers.enter_context(_worker(broker.address, uri, 64, True))
            rate, latencies = asyncio.run(_measure_aio(broker.address, uri, count, window))
        name = "request/reply asyncio, SDK->broker (no proxy, for its cost)"
        results.append(_figures(name, rate, latencies, count, window, WORKERS))
    with (
        harness.ScriptServer("rpcload.py", ["unary", "--listen", "127.0.0.1:0"]) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        echo = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        rate, latencies = _time_calls(
            lambda: echo.future(PAYLOAD, timeout=60),
            lambda: echo(PAYLOAD, timeout=60),
            count // 4,
            min(64, window),
        )
        results.append(
            _figures(
                "plain gRPC unary (grpc.aio server)",
                rate,
                latencies,
                count // 4,
                min(64, window),
                0,
            )
        )
    return results


def _measure_threaded(address: str, uri: str, count: int, window: int) -> tuple[float, list[float]]:
    with Session(address) as session:
        return _time_calls(
            lambda: session.request_async(uri, PAYLOAD, timeout=60),
            lambda: session.request(uri, PAYLOAD, timeout=60),
            count,
            window,
        )


async def _measure_aio(
    address: str, uri: str, count: int, window: int
) -> tuple[float, list[float]]:
    """``_time_calls`` on the event loop: warm-up, sequential calls, then ``count`` calls
    with ``window`` in flight."""
    async with aio.Session(address) as session:
        for _ in range(max(20, count // 20)):
            await session.request(uri, PAYLOAD, timeout=60)
        latencies = []
        for _ in range(min(count // 10, 1000)):
            started = time.perf_counter()
            await session.request(uri, PAYLOAD, timeout=60)
            latencies.append(time.perf_counter() - started)
        left = [count]

        async def lane() -> None:
            # One of ``window`` lanes, each a call at a time, so ``window`` are in
            # flight without a task and a semaphore round per call.
            while left[0] > 0:
                left[0] -= 1
                await session.request(uri, PAYLOAD, timeout=60)

        started = time.perf_counter()
        lanes = min(window, count)
        await asyncio.wait_for(asyncio.gather(*(lane() for _ in range(lanes))), 300)
        return count / (time.perf_counter() - started), latencies


def _figures(
    name: str, rate: float, latencies: list[float], count: int, window: int, workers: int
) -> CallFigures:
    return CallFigures(
        name,
        rate,
        harness.percentile(latencies, 50),
        harness.percentile(latencies, 99),
        count,
        window,
        len(latencies),
        workers,
        len(latencies) / sum(latencies) if latencies else 0.0,
    )


class _worker:
    """The worker subprocess, stopped by PID."""

    def __init__(self, address: str, uri: str, concurrency: int, aio: bool = False) -> None:
        self._args = [sys.executable, __file__, "worker", address, uri, "--concurrency"]
        self._args.append(str(concurrency))
        if aio:
            self._args.append("--aio")
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> None:
        self._proc = subprocess.Popen(self._args, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            self.__exit__()
            raise RuntimeError("the bench worker did not start")

    def __exit__(self, *exc_info: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self._proc.pid, signal.SIGKILL)
                self._proc.wait(5)


def _run_worker(address: str, uri: str, concurrency: int) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    def echo(request: Request) -> bytes:
        return request.payload

    with Session(address) as session, Worker(session, uri, echo, concurrency=concurrency):
        print("ready", flush=True)
        stop.wait()


async def _run_aio_worker(address: str, uri: str, concurrency: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def echo(request: Request) -> bytes:
        return request.payload

    async with (
        aio.Session(address) as session,
        aio.Worker(session, uri, echo, concurrency=concurrency),
    ):
        print("ready", flush=True)
        await stop.wait()


async def _serve_unary(listen: str) -> None:
    async def echo(request: bytes, context: Any) -> bytes:
        return request

    handler = grpc.unary_unary_rpc_method_handler(
        echo, request_deserializer=None, response_serializer=None
    )
    await serve_raw(METHOD, handler, listen)


def main(argv: list[str] | None = None) -> int:
    """Run the unary server or the worker until SIGTERM; or, with no command, measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    unary = commands.add_parser("unary")
    unary.add_argument("--listen", default="127.0.0.1:0")
    worker = commands.add_parser("worker")
    worker.add_argument("address")
    worker.add_argument("uri")
    worker.add_argument("--concurrency", type=int, default=8)
    worker.add_argument("--aio", action="store_true", help="the asyncio Worker")
    commands.add_parser("before", help="#35's old shape on the tree this process imports")
    parser.add_argument("--count", type=int, default=20_000, help="pipelined calls per row")
    parser.add_argument("--window", type=int, default=WINDOW, help="calls in flight")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.command == "unary":
        asyncio.run(_serve_unary(args.listen))
    elif args.command == "before":
        figures = _old_shape(args.count, min(BEFORE_WINDOW, args.window))
        print(json.dumps(asdict(figures)), flush=True)
    elif args.command == "worker":
        if args.aio:
            asyncio.run(_run_aio_worker(args.address, args.uri, args.concurrency))
        else:
            _run_worker(args.address, args.uri, args.concurrency)
    else:
        # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every server we started.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        for figures in measure(args.count, args.window):
            print(asdict(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""grpc.aio alone: do a stream's writes complete while the event loop is busy?

    .venv/bin/python bench/grpc_busy_loop.py [--streams 1 10 100 300] [--busy-ms 2000]

No Holdfast code: a grpc.aio server in a child process reads bidirectional streams of
100-KB messages; this process opens ``streams`` channels with one stream each, a
writer task per stream (``await call.write`` of each message its queue gets), and as
many producer tasks that keep the loop busy for ``busy_ms`` ms in all: each does a
little pure-Python work, queues a message for its writer every 16 steps and yields
(``asyncio.sleep(0)``), so the loop turns every ~50 ms whatever the stream count (the
shape of ``scale._sessions_run``'s 300 sessions posting). Printed per stream count:
the writes completed while the loop was busy, and after. ``--sleep`` keeps the loop
busy in ``time.sleep`` instead (the interpreter lock released); ``--frame-bytes``
sets the message size.

``--read-all`` replaces grpc's reader of its wake-ups (``read_all``) with one that reads
every waiting byte at each turn.

Why (grpcio 1.85.3): grpc.aio polls gRPC's completion queue on a thread of its own
(``PollerCompletionQueue``) that, for each completion (a message sent, one received),
queues the event and writes one byte to a blocking socket pair; the loop's reader
reads **one** byte a turn and handles every queued event. A loop that gets more
completions than it turns leaves bytes unread, and after some 280 of them (each
one-byte write holds about a KiB of the socket's buffer) the poller thread blocks on
its write until most of them are read, one a turn: meanwhile no completion reaches
the loop. Measured on 2026-11-28 (2 cores, ``bench/PROFILE.md``), writes completed
while the loop was busy: 1 stream 12-13 of 40, 10 streams 185-298 of 400, 100
streams 183 of 4,000, 300 streams **0 of 12,000** (the same with ``--sleep``, with
10-KB messages and with every stream on one channel); with ``--read-all`` 100 streams
1,892-1,900 and 300 streams 5,862-7,585.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import fcntl
import functools
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from typing import Any

import grpc

METHOD = "/holdfast.bench.Busy/Stream"
FRAME = bytes(100_000)
EVERY = 16
"""Work steps between a producer's messages and turns of the loop."""


async def _serve() -> None:
    async def stream(requests: Any, context: Any) -> Any:
        async for _ in requests:
            pass
        yield b"done"

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "holdfast.bench.Busy",
        {"Stream": grpc.stream_stream_rpc_method_handler(stream)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


_HANDLER = "_handle_events"
_POLLER = "PollerCompletionQueue"


class _ReadAll:
    """The loop's reader of grpc's wake-up socket: grpc's handler once per byte."""

    def __init__(self, handle_events: Callable[..., None], args: tuple[Any, ...], fileno: int):
        self.handle_events = handle_events
        self.args = args
        self.fileno = fileno

    def __call__(self) -> None:
        waiting = array.array("i", [0])
        try:
            fcntl.ioctl(self.fileno, termios.FIONREAD, waiting)
        except OSError:
            waiting[0] = 0
        # Readable with nothing counted is the end of the socket: grpc's handler
        # once, as before. Each call reads one byte, so none of them blocks.
        for _ in range(max(1, waiting[0])):
            self.handle_events(*self.args)


def read_all(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Read grpc.aio's wake-ups in full on ``loop`` (the running loop by default);
    True if its reader is now ours (also when it already was). Call it once grpc.aio
    has an object on the loop (a channel or a server): grpc sets its reader up then."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
    selector: Any = getattr(loop, "_selector", None)
    if selector is None:
        return False
    try:
        keys = list(selector.get_map().values())
    except (AttributeError, RuntimeError):
        return False
    for key in keys:
        reader = key.data[0] if isinstance(key.data, tuple) else None
        callback = getattr(reader, "_callback", None)
        if isinstance(callback, _ReadAll):
            return True
        # grpcio 1.85 registers ``functools.partial(queue._handle_events, loop)``.
        method = callback.func if isinstance(callback, functools.partial) else callback
        owner = getattr(method, "__self__", None)
        if getattr(method, "__name__", "") != _HANDLER or type(owner).__name__ != _POLLER:
            continue
        assert callback is not None
        args = tuple(getattr(reader, "_args", None) or ())
        loop.add_reader(key.fileobj, _ReadAll(callback, args, key.fd))
        return True
    return False


def _work(steps: int) -> int:
    total = 0
    for i in range(steps):
        total += i
    return total


def _steps_per_ms() -> int:
    started = time.perf_counter()
    _work(100_000)
    return max(1, round(100_000 / ((time.perf_counter() - started) * 1000)))


async def _run(
    port: int,
    streams: int,
    busy_ms: float,
    frame: bytes,
    sleep: bool,
    shared: bool,
    read_in_full: bool,
) -> tuple[int, int, float]:
    """(writes completed while busy, writes in all, seconds from the end of the busy
    phase to the last write's completion)."""
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(1 if shared else streams)
    ]
    calls = [channels[i % len(channels)].stream_stream(METHOD)() for i in range(streams)]
    queues: list[asyncio.Queue[bytes | None]] = [asyncio.Queue() for _ in range(streams)]
    completed = [0]
    rounds = 40  # turns of the loop each producer takes: ~50 ms each
    steps = max(1, round(busy_ms * _steps_per_ms() / (streams * rounds * EVERY)))
    nap = busy_ms / 1000 / (streams * rounds)

    async def writer(call: Any, queue: asyncio.Queue[bytes | None]) -> None:
        while (message := await queue.get()) is not None:
            await call.write(message)
            completed[0] += 1
        await call.done_writing()

    async def producer(queue: asyncio.Queue[bytes | None]) -> None:
        for _ in range(rounds):
            if sleep:  # busy without the interpreter lock
                time.sleep(nap)
            else:
                for _ in range(EVERY):
                    _work(steps)
            queue.put_nowait(frame)
            await asyncio.sleep(0)
        queue.put_nowait(None)

    if read_in_full:
        assert read_all()
    writers = [asyncio.create_task(writer(c, q)) for c, q in zip(calls, queues, strict=True)]
    await asyncio.gather(*(producer(queue) for queue in queues))
    busy_end = time.perf_counter()
    while_busy = completed[0]
    await asyncio.gather(*writers)
    drained = time.perf_counter() - busy_end
    for call in calls:
        await call.read()  # the server's answer once it read everything
    for channel in channels:
        await channel.close()
    return while_busy, completed[0], drained


def main() -> None:
    """Run each stream count against a fresh server and print what completed when."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="measure", choices=("measure", "serve"))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 10, 100, 300])
    parser.add_argument("--busy-ms", type=float, default=2000.0)
    parser.add_argument(
        "--read-all",
        action="store_true",
        help="grpc's wake-ups read in full at every turn (read_all)",
    )
    parser.add_argument("--one-channel", action="store_true", help="every stream on one channel")
    parser.add_argument("--frame-bytes", type=int, default=len(FRAME))
    parser.add_argument(
        "--sleep", action="store_true", help="keep the loop busy in time.sleep (no GIL held)"
    )
    args = parser.parse_args()
    if args.role == "serve":
        asyncio.run(_serve())
        return
    for streams in args.streams:
        server = subprocess.Popen(
            [sys.executable, __file__, "serve"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            while_busy, total, drained = asyncio.run(
                _run(
                    port,
                    streams,
                    args.busy_ms,
                    bytes(args.frame_bytes),
                    args.sleep,
                    args.one_channel,
                    args.read_all,
                )
            )
        finally:
            server.terminate()
            server.wait(timeout=10)
        print(
            f"{streams:4d} streams: {while_busy:5d} of {total} writes completed while the "
            f"loop was busy, the rest in {drained:.2f} s after it"
        )


if __name__ == "__main__":
    main()

"""The two ends of a big data-stream call, each a process of its own (so that its peak
memory is its own): ``tests/rpc/test_stream_memory.py`` starts them and kills the proxy
between them mid-stream.

``python -m tests.rpc.stream_main worker ADDRESS URI SIZE [--aio] [--stop-at N]``:
serves ``URI``; a request's stream ``data`` is read and digested, and the reply
carries the digest and a stream ``data`` of ``SIZE`` pseudo-random bytes. Prints
``ready``, and ``delivery K`` for each request it runs (its delivery count). With
``--stop-at``, the handler stops reading once it has read ``N`` bytes, prints
``stopped``, and hangs there until the process is killed (a worker lost mid-stream,
``tests/rpc/test_stream_worker_lost.py``).

``python -m tests.rpc.stream_main caller ADDRESS URI SIZE [--aio]``: one call with a
stream ``data`` of ``SIZE`` pseudo-random bytes; reads the reply's stream and prints
one JSON line: both digests as read and as expected.

Both print ``read N`` each time another ``PROGRESS`` bytes of the stream they read
have come, so the test knows where the stream is.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import threading
from collections.abc import AsyncIterator

from holdfast.sdk import Request, Session, StreamingReply, Worker, aio
from tests.support.sessions import FAST

MB = 1024 * 1024
PROGRESS = 16 * MB
READ = 256 * 1024


class Pattern:
    """``size`` pseudo-random bytes (the same for the same ``seed``) as a binary
    readable; cheap to make, so both ends can know the digest without keeping data."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.sent = 0
        # Periodic (4099, prime to every chunk size), so that a byte's value depends on
        # its position only, however the stream is cut; a lost or repeated chunk shifts
        # everything after it.
        base = random.Random(seed).randbytes(4099)
        self._block = (base * (MB // 4099 + 2))[: MB + 4099]

    def read(self, n: int = -1) -> bytes:
        """The next ``n`` bytes (at most 1 MiB)."""
        n = min(MB if n < 0 else n, MB, self.size - self.sent)
        start = self.sent % 4099
        self.sent += n
        return self._block[start : start + n]


def expected_digest(size: int, seed: int) -> str:
    """The SHA-256 of ``Pattern(size, seed)``."""
    pattern, digest = Pattern(size, seed), hashlib.sha256()
    while data := pattern.read():
        digest.update(data)
    return digest.hexdigest()


class Progress:
    """Digests what is read and prints ``read N`` every ``PROGRESS`` bytes."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.total = 0

    def add(self, data: bytes) -> None:
        before = self.total
        self.digest.update(data)
        self.total += len(data)
        if self.total // PROGRESS > before // PROGRESS:
            print(f"read {self.total}", flush=True)


def worker(address: str, uri: str, size: int, use_aio: bool, stop_at: int | None = None) -> None:
    """Serve until killed."""

    def hang_past(progress: Progress) -> None:
        if stop_at is not None and progress.total >= stop_at:
            print("stopped", flush=True)
            threading.Event().wait()  # until killed

    def handle(request: Request) -> StreamingReply:
        print(f"delivery {request.delivery_count}", flush=True)
        progress = Progress()
        while data := request.streams["data"].read(READ):
            progress.add(data)
            hang_past(progress)
        answer = f"{progress.total}:{progress.digest.hexdigest()}".encode()
        return StreamingReply(answer, streams={"data": Pattern(size, 2)})

    async def handle_async(request: Request) -> StreamingReply:
        print(f"delivery {request.delivery_count}", flush=True)
        progress = Progress()
        async for data in request.streams["data"]:
            progress.add(data)
            if stop_at is not None and progress.total >= stop_at:
                print("stopped", flush=True)
                await asyncio.Event().wait()  # until killed
        answer = f"{progress.total}:{progress.digest.hexdigest()}".encode()
        return StreamingReply(answer, streams={"data": Pattern(size, 2)})

    async def serve() -> None:
        async with (
            aio.Session(address, options=FAST) as session,
            aio.Worker(session, uri, handle_async),
        ):
            print("ready", flush=True)
            await asyncio.Event().wait()

    if use_aio:
        asyncio.run(serve())
        return
    with Session(address, options=FAST) as session, Worker(session, uri, handle):
        print("ready", flush=True)
        threading.Event().wait()  # until killed


def caller(address: str, uri: str, size: int, use_aio: bool) -> dict[str, str]:
    """Call once with a ``size``-byte stream; the digests of both streams."""
    progress = Progress()

    async def call_async() -> bytes:
        async with aio.Session(address, options=FAST) as session:
            reply = await session.request(uri, b"", streams={"data": Pattern(size, 1)}, timeout=600)
            stream: AsyncIterator[bytes] = reply.streams["data"]
            async for data in stream:
                progress.add(data)
            return reply.payload

    if use_aio:
        payload = asyncio.run(call_async())
    else:
        with Session(address, options=FAST) as session:
            reply = session.request(uri, b"", streams={"data": Pattern(size, 1)}, timeout=600)
            while data := reply.streams["data"].read(READ):
                progress.add(data)
            payload = reply.payload
    return {
        "request_read": payload.decode(),
        "request_expected": f"{size}:{expected_digest(size, 1)}",
        "reply_read": f"{progress.total}:{progress.digest.hexdigest()}",
        "reply_expected": f"{size}:{expected_digest(size, 2)}",
    }


def main() -> None:
    """Run one end (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("worker", "caller"))
    parser.add_argument("address")
    parser.add_argument("uri")
    parser.add_argument("size", type=int)
    parser.add_argument("--aio", action="store_true")
    parser.add_argument("--stop-at", type=int, default=None)
    args = parser.parse_args()
    if args.role == "worker":
        worker(args.address, args.uri, args.size, args.aio, args.stop_at)
    else:
        print(json.dumps(caller(args.address, args.uri, args.size, args.aio)), flush=True)


if __name__ == "__main__":
    main()

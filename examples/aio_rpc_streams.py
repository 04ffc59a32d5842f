"""Request/reply with data streams on asyncio: a coroutine handler reads an upload of
any size with ``async for`` and answers with a stream of its own from an async
generator (``python examples/aio_rpc_streams.py``, with ``$HOLDFAST_ADDRESS``
pointing at a broker or a proxy).

The README's asyncio data-stream block is this file's ``main``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator

from holdfast.sdk import Request, StreamingReply
from holdfast.sdk.aio import Session, Worker


async def report_lines() -> AsyncIterator[bytes]:
    """A reply stream made as it is sent: any async iterable of bytes will do."""
    for line in (b"checked by the asyncio example worker\n", b"end of report\n"):
        yield line


async def main() -> None:
    """Upload 8 MiB, get its SHA-256 back as the payload and a report as a stream."""
    uri = "hf://examples/aio-checksum"
    os.chdir(tempfile.mkdtemp(prefix="holdfast-aio-streams-"))
    with open("big.bin", "wb") as big:
        big.write(os.urandom(8 << 20))
    async with Session() as session:

        async def handle(request: Request) -> StreamingReply:
            digest = hashlib.sha256()
            async for chunk in request.streams["upload"]:  # or await ....read(n)
                digest.update(chunk)
            return StreamingReply(digest.hexdigest().encode(), {}, {"report": report_lines()})

        async with Worker(session, uri, handle):
            with open("big.bin", "rb") as upload:  # read in the loop's executor
                reply = await session.request(uri, b"", streams={"upload": upload}, timeout=600)
            report = await reply.streams["report"].read()  # all of it; or read(n), async for
            print(f"report: {report.decode().splitlines()[0]}")
            with open("big.bin", "rb") as again:
                expected = hashlib.sha256(again.read()).hexdigest()
            print(f"digest matches: {reply.payload.decode() == expected}")


if __name__ == "__main__":
    asyncio.run(main())

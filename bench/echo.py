"""The raw ceiling: a plain batched gRPC bidirectional-streaming echo on raw bytes.

As a script it is the server, a grpc.aio server with a generic handler (no
protobuf, no deserializer) that writes every request back on the same stream::

    python bench/echo.py --listen 127.0.0.1:0     # logs "listening on HOST:PORT"

``echo_rate`` is the client, shaped like the SDK's link: a sync ``grpc`` channel,
one ``stream_stream`` call whose request iterator gRPC pulls on a thread of its
own, and the replies read on the calling thread. It sends ``count`` messages of
``size`` bytes in batches of ``batch`` messages (one ready-made bytes object per
batch, so no per-message Python work at all) and times until the last echo is back.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

METHOD = "/holdfast.bench.Echo/Stream"
MAX_MESSAGE = 64 * 1024 * 1024


def echo_rate(address: str, count: int, size: int, batch: int) -> float:
    """Messages per second through the echo, first request to last reply."""
    batch = max(1, min(batch, count))
    frames = [bytes(size * batch)] * (count // batch)
    if count % batch:
        frames.append(bytes(size * (count % batch)))
    expected = sum(len(frame) for frame in frames)
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    with grpc.insecure_channel(address, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        call = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)
        started = time.perf_counter()
        received = 0
        for reply in call(iter(frames), timeout=120):
            received += len(reply)
            if received >= expected:
                break
        seconds = time.perf_counter() - started
    return count / seconds


async def _serve(listen: str) -> None:
    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.max_receive_message_length", MAX_MESSAGE),
    ]
    handler = grpc.stream_stream_rpc_method_handler(
        stream, request_deserializer=None, response_serializer=None
    )
    await serve_raw(METHOD, handler, listen, options)


async def serve_raw(
    full_method: str, handler: Any, listen: str, options: list[tuple[str, int]] | None = None
) -> None:
    """Serve one raw-bytes gRPC method on ``listen`` until SIGTERM or SIGINT, logging
    ``listening on HOST:PORT`` (the bench's reference servers: this echo, the unary
    call of ``rpcload``)."""
    server = grpc.aio.server(options=options or [])
    service, method = full_method.strip("/").split("/")
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port(listen)
    await server.start()
    logging.info("listening on %s:%d", listen.rpartition(":")[0], port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0)


def main(argv: list[str] | None = None) -> int:
    """Run the echo server until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description="raw-bytes gRPC echo server for the bench")
    parser.add_argument("--listen", default="127.0.0.1:0")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    asyncio.run(_serve(args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())

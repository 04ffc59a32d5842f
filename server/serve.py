"""Serving the contract: binding a grpc.aio server of the session stream, its
options, the graceful stop on a signal, and ``HOST:PORT`` addresses. Shared by the
broker and the proxy."""

from __future__ import annotations

import asyncio
import errno
import gc
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from holdfast.proto import COMMIT_MARK, SERVICE_NAME, STAGING, pb
from holdfast.sdk.failover import refuse_url_scheme

COLLECTOR_THRESHOLDS = (20_000, 10, 10)
"""The cyclic garbage collector's thresholds in the broker and proxy processes (the
SDK leaves its host's alone). Python's default (700, 10, 10) runs a young collection
every 700 net allocations; a broker makes about five per message, so at 100k msg/s
it collected 700 times a second and every few seconds walked the whole heap of
queued messages: 15 % of the broker's CPU with one queue, 21 % with 10k open queues
(300k PUTs, measured with ``gc.callbacks``). At 20k a whole-heap walk comes at most
every 2M allocations (20k x 10 x 10), and the collector's share fell to about 6 % in
both; a young collection then scans up to 20k objects (about 1 ms). The hot paths make
no reference cycles; the few the rest makes (a failed task's traceback) are still
collected, only later."""


def tune_collector() -> None:
    """Set ``COLLECTOR_THRESHOLDS`` and move everything made at start-up (modules,
    configuration) out of the collector's sight, so full collections walk only what
    serving made. Called by the broker's and the proxy's ``main`` once set up."""
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    gc.freeze()


def _check_free(listen: str) -> None:
    """Say plainly that a listen port is taken, or its host is not an address of this
    machine, before gRPC tries it: gRPC's own failure is a C-core log line plus "Failed
    to bind" with no reason, two ERROR lines for one mistake. Port 0 is probed too (an
    ephemeral port): what it checks is the host."""
    host, port = split_host_port(listen)
    try:
        family, _, _, _, where = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as error:  # socket.gaierror: "Name or service not known"
        raise OSError(f"cannot listen on {listen} (--listen): {error.strerror}") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
        except OSError as error:
            why = "the port is in use" if error.errno == errno.EADDRINUSE else error.strerror
            raise OSError(f"cannot listen on {listen} (--listen): {why}") from None


def version_text(program: str) -> str:
    """``PROGRAM VERSION (protocol N)`` for a server's ``--version``."""
    from importlib.metadata import PackageNotFoundError, version

    from holdfast.proto import PROTOCOL_VERSION

    try:
        installed = version("holdfast-mq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "unknown"
    return f"{program} {installed} (protocol {PROTOCOL_VERSION})"


def split_host_port(address: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` too); raise ``ValueError`` if it is not one."""
    refuse_url_scheme(address)
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


def metrics_endpoint(listen: str | None, port: int | None) -> tuple[str, int, str] | None:
    """Where a server's metrics endpoint listens, and the flag that said so:
    ``--metrics-listen HOST:PORT`` (any host) wins over ``--metrics-port`` (127.0.0.1)."""
    if listen is not None:
        host, bound = split_host_port(listen)
        return host, bound, "--metrics-listen"
    if port is not None:
        return "127.0.0.1", port, "--metrics-port"
    return None


async def serve_until_signalled(stop: Callable[[], Awaitable[None]]) -> None:
    """Wait for SIGTERM or SIGINT, then ``await stop()`` (a graceful stop).

    Once the stop has begun, further SIGTERM/SIGINT are ignored for the rest of the
    process: the stop is bounded by its grace period, and a second signal arriving
    after the event loop has closed would otherwise kill the process mid-exit.
    """
    signalled = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signalled.set)
    await signalled.wait()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(signum)
        signal.signal(signum, signal.SIG_IGN)
    await stop()


def _serialize(frame: pb.ServerFrame | bytes) -> bytes:
    # Bytes are frames serialized already (a batch of them: ``ContractStream``).
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """gRPC server arguments for a server of the contract (broker or proxy).

    ``max_message_bytes`` is ``Limits.max_frame_bytes`` of what the server announces
    (``FRAME_CEILING`` for a proxy, which binds before it learns them): every valid
    frame fits, including a PUT over the payload limit by up to a batch, which is
    answered PAYLOAD_TOO_LARGE; a bigger frame breaks the contract and gRPC ends
    the stream with RESOURCE_EXHAUSTED.
    """
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # Notice dead clients (their consumers' messages must be redelivered).
        ("grpc.keepalive_time_ms", 5000),
        ("grpc.keepalive_timeout_ms", 5000),
        # Without this a keepalive ping that merged with another ping waits for gRPC's
        # generic 60 s ping timeout, and a frozen client goes unnoticed for a minute.
        ("grpc.http2.ping_timeout_ms", 5000),
        ("grpc.http2.max_pings_without_data", 0),
        # SDK clients ping every 1-2 s to detect black holes; let them, without strikes.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
        ("grpc.http2.max_ping_strikes", 0),
        # A second server on a port in use must fail, not share the port silently.
        ("grpc.so_reuseport", 0),
        # A stream the server does not read (a proxy client over its buffer share) must
        # not fill gRPC's own buffers instead: with BDP probing its receive window grew
        # to ~7 MiB a stream, so six clients flooding a proxy bounded at 8 MiB took it
        # 43 MiB over its RSS at rest, 17 MiB without; 1-GB streams, 100-B and 16-KiB
        # PUT->ACK ran at the same rates either way (2026-11-28, bench/PROFILE.md).
        ("grpc.http2.bdp_probe", 0),
    ]


async def start_server(
    listen: str,
    max_message_bytes: int,
    serve_session: Callable[[Any, Any], Any],
    serve_commit_mark: Callable[[pb.CommitMarkRequest, Any], Awaitable[pb.CommitMarkReply]]
    | None = None,
    services: Sequence[grpc.GenericRpcHandler] = (),
    credentials: grpc.ServerCredentials | None = None,
    serve_staging: Callable[[pb.StagingRequest, Any], Awaitable[pb.StagingReply]] | None = None,
) -> tuple[Any, int]:
    """Bind a grpc.aio server of the contract on ``listen`` and start it; return it and
    the bound port. The session method takes raw bytes (no request deserializer), so
    that bytes which are not a ClientFrame get a typed Error instead of failing the
    stream. ``serve_commit_mark`` serves the unary ``CommitMark`` method (the broker
    keeps marks, the proxy relays them), ``serve_staging`` the unary ``Staging`` method
    (transactional writes, likewise); ``services`` are further services (the
    broker's admin service). With ``credentials`` the listener speaks TLS only
    (``holdfast.server.security``). Raises ``OSError`` if the address cannot be bound."""
    _check_free(listen)
    server = grpc.aio.server(options=server_options(max_message_bytes))
    handler = grpc.stream_stream_rpc_method_handler(
        serve_session, request_deserializer=None, response_serializer=_serialize
    )
    methods = {"Session": handler}
    if serve_commit_mark is not None:
        methods[COMMIT_MARK] = grpc.unary_unary_rpc_method_handler(
            serve_commit_mark,
            request_deserializer=pb.CommitMarkRequest.FromString,
            response_serializer=pb.CommitMarkReply.SerializeToString,
        )
    if serve_staging is not None:
        methods[STAGING] = grpc.unary_unary_rpc_method_handler(
            serve_staging,
            request_deserializer=pb.StagingRequest.FromString,
            response_serializer=pb.StagingReply.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, methods), *services)
    )
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError as error:
        raise OSError(f"cannot listen on {listen}: {error}") from error
    if not port:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    return server, port

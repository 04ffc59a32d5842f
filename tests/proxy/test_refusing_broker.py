"""A broker that refuses the proxy (another protocol version) does not wedge it: the
proxy tells its clients why no broker is reachable, tries the next address of its
list, and serves again once a broker it can use listens where the old one was."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from holdfast.proto import SERVICE_NAME, pb
from holdfast.sdk import HoldfastError, Session
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.toxics import free_port

MISMATCH = "the client speaks protocol version 3; this server speaks version 2"


def _refuse(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    for _ in requests:  # the Hello
        error = pb.Error(status=pb.STATUS_VERSION_MISMATCH, message=MISMATCH, fatal=True)
        yield pb.ServerFrame(error=error).SerializeToString()
        return


def old_broker(port: int) -> grpc.Server:
    """A broker of another protocol version on ``port``: it refuses every Hello."""
    handler = grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Session": grpc.stream_stream_rpc_method_handler(
                _refuse, request_deserializer=bytes, response_serializer=bytes
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def post_once(address: str) -> bool:
    with Session(address, options=FAST) as session:
        queue = session.open_queue(unique_uri("refused"), write=True, timeout=20)
        queue.post(b"x")
        return session.flush(20)


def test_the_proxy_tells_why_and_serves_once_a_usable_broker_listens_there() -> None:
    port = free_port()
    old = old_broker(port)
    try:
        with ProxyProcess(["--upstream", f"127.0.0.1:{port}"]) as proxy:
            with (
                Session(proxy.address, options=FAST) as session,
                pytest.raises(HoldfastError, match="protocol version"),
            ):
                session.open_queue(unique_uri("refused"), write=True, timeout=3)
            old.stop(0).wait()
            with BrokerProcess(port=port):
                assert post_once(proxy.address)
    finally:
        old.stop(0)


def test_the_proxy_goes_on_to_the_next_address_after_a_refusal(broker: BrokerProcess) -> None:
    port = free_port()
    old = old_broker(port)
    try:
        with ProxyProcess(["--upstream", f"127.0.0.1:{port},{broker.address}"]) as proxy:
            assert post_once(proxy.address)
    finally:
        old.stop(0)

"""A client through the proxy cannot make it hold more PUSHes than the proxy's own flow
limits, whatever it asks for.

PUSHes wait in the proxy until their client reads them, so the proxy asks the broker
for at most ``ProxyConfig.max_unconfirmed_bytes`` (an eighth of ``--max-buffer-bytes``)
and ``max_unconfirmed_messages`` per client handle. A client that asks for 2**64-1
bytes and never reads its stream holds the proxy to that; once it leaves, a consumer
through the proxy still gets every message, the flow going on as it confirms.
(Before, the client's limits went upstream as they were: 30,000 queued 4-KiB messages
took a proxy from 47 to 183 MiB of RSS.)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from holdfast.proto import SESSION_METHOD, pb
from holdfast.proxy.config import ProxyConfig
from holdfast.sdk import QueueOptions, Session
from holdfast.sdk.admin import AdminClient
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import drain, unique_uri
from tests.support.waiting import wait_until

BOUND = 8 * 1024 * 1024
MESSAGES = 1000
PAYLOAD_BYTES = 4096
CAP = BOUND // 8
"""``ProxyConfig.max_unconfirmed_bytes`` at this bound (``test_the_flow_limits_...``)."""


def unconfirmed(broker: str, uri: str) -> int:
    """Messages of ``uri`` the broker has pushed and not had confirmed."""
    with AdminClient(broker, timeout=5.0) as admin:
        return admin.stats(uri).unconfirmed


@pytest.mark.timeout(120)
def test_a_client_asking_for_unbounded_pushes_gets_the_proxys_limit_and_then_everything() -> None:
    uri = unique_uri("greedy")
    most = CAP // PAYLOAD_BYTES + 1
    with (
        BrokerProcess() as broker,
        ProxyProcess(["--upstream", broker.address, "--max-buffer-bytes", str(BOUND)]) as proxy,
    ):
        with Session(broker.address) as producer:
            queue = producer.open_queue(uri, write=True)
            posted = queue.post_many([os.urandom(PAYLOAD_BYTES)] * MESSAGES)
            assert producer.flush(timeout=30)

        # A client that asks for everything and never reads past its HelloReply.
        done = threading.Event()

        def frames() -> Iterator[pb.ClientFrame]:
            yield pb.ClientFrame(hello=pb.Hello(protocol_version=3, client_id="greedy"))
            options = pb.QueueOptions(
                max_unconfirmed_messages=2**32 - 1, max_unconfirmed_bytes=2**64 - 1
            )
            yield pb.ClientFrame(
                open_queue=pb.OpenQueue(
                    request_id=1, queue_id=1, uri=uri, read=True, options=options
                )
            )
            done.wait(60)

        channel = grpc.insecure_channel(proxy.address)
        try:
            call = channel.stream_stream(
                SESSION_METHOD,
                request_serializer=pb.ClientFrame.SerializeToString,
                response_deserializer=pb.ServerFrame.FromString,
            )(frames())
            next(call)  # the HelloReply; nothing more is read
            wait_until(
                lambda: unconfirmed(broker.address, uri) >= most - 1,
                30,
                "the broker to push to the greedy client",
            )
            # A bounded quiet period: the broker would push the rest within it, were the
            # client's own limits asked for.
            quiet_until = time.monotonic() + 2.0
            while time.monotonic() < quiet_until:
                assert unconfirmed(broker.address, uri) <= most
                time.sleep(0.1)  # polling a bounded quiet period, not waiting for an event
        finally:
            done.set()
            channel.close()

        # Its messages come back; a consumer through the proxy gets every one.
        assert set(drain(proxy.address, uri, MESSAGES)) == set(posted)


def test_the_flow_limits_asked_upstream_are_the_clients_cut_to_the_proxys() -> None:
    config = ProxyConfig(max_buffer_bytes=BOUND)
    assert config.max_unconfirmed_bytes == CAP
    assert config.max_unconfirmed_messages == CAP // 1024
    huge = pb.QueueOptions(max_unconfirmed_messages=2**32 - 1, max_unconfirmed_bytes=2**64 - 1)
    assert config.flow_limits(huge) == QueueOptions(CAP // 1024, CAP)
    small = pb.QueueOptions(max_unconfirmed_messages=10, max_unconfirmed_bytes=0)
    assert config.flow_limits(small) == QueueOptions(10, 0)
    assert config.flow_limits(None) == QueueOptions(1000, CAP)
    assert ProxyConfig().flow_limits(None) == QueueOptions()  # the defaults fit at 256 MiB

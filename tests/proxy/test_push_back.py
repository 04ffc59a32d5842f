"""The broker's push-back reaches a client through the proxy as it would directly (rule
7, the same contract through the sidecar): a queue at its depth limit answers QUEUE_FULL,
the proxy relays it instead of keeping the PUT, so the client's SDK keeps it and its next
``post()`` waits and then raises ``BrokerBusyError``; once there is room the kept PUT
goes in once."""

from __future__ import annotations

import time
import uuid

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import Ack, AckStatus, BrokerBusyError, Session
from holdfast.sdk.admin import AdminClient
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_full_queue_pushes_back_on_post_through_the_proxy(broker: BrokerProcess) -> None:
    uri = unique_uri("full")
    with AdminClient(broker.address) as admin:
        admin.set_policy(uri, QueuePolicy(max_messages=2))
    acks: dict[uuid.UUID, AckStatus] = {}

    def on_ack(ack: Ack) -> None:
        acks[ack.guid] = ack.status

    with (
        ProxyProcess(["--upstream", broker.address]) as proxy,
        Session(proxy.address, options=FAST) as session,
    ):
        queue = session.open_queue(uri, write=True, on_ack=on_ack)
        posted = [queue.post(b"m%d" % i) for i in range(3)]
        wait_until(lambda: len(acks) == 2, 10, "two ACKs")
        wait_until(lambda: session.stats().buffered_puts == 1, 10, "the third kept")
        started = time.monotonic()
        with pytest.raises(BrokerBusyError, match=r"depth limit|pushed back"):
            queue.post(b"refused")
        assert time.monotonic() - started >= 4.5  # post() waited before refusing
        reader = session.open_queue(uri, read=True, on_message=lambda m: m.confirm())
        assert session.flush(timeout=20)
        reader.close()
    assert acks == {guid: AckStatus.SUCCESS for guid in posted}

"""Bad frames from the broker end the proxy's upstream connection, never its upstream task
(issue #11 item 7): the proxy reconnects, keeps serving its clients, and still exits 0
on SIGTERM. A fake broker (real gRPC, frames written by hand) sends a PUSH whose GUID
is 3 bytes.
"""

from __future__ import annotations

import contextlib

import pytest

from holdfast.sdk import AckStatus, Session
from holdfast.sdk.driver import MAX_BAD_CONNECTIONS
from tests.support.fake_broker import FakeBroker, Script, push_with_short_guid
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.recorder import AckRecorder, MessageRecorder
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

URI = "hf://test/bad-upstream"


@pytest.mark.timeout(90)
def test_the_proxy_reconnects_after_a_bad_frame_and_keeps_serving() -> None:
    with (
        FakeBroker(Script(push_with_short_guid, bad_connections=1)) as fake,
        ProxyProcess(["--upstream", fake.address]) as proxy,
    ):
        with Session(proxy.address, options=FAST) as consumer:
            consumer.open_queue(URI, read=True, on_message=MessageRecorder())
            wait_until(lambda: fake.connections >= 2, timeout=20, what="an upstream reconnect")
            acks = AckRecorder()
            with Session(proxy.address, options=FAST) as producer:
                queue = producer.open_queue(URI, write=True, on_ack=acks)
                guids = {queue.post(b"%d" % i) for i in range(10)}
                assert producer.flush(timeout=20)
            assert acks.with_status(AckStatus.SUCCESS) == guids
        assert "dropped the connection to" in proxy.output
        assert proxy.terminate() == 0


@pytest.mark.timeout(90)
def test_an_upstream_ack_status_no_ack_carries_is_not_relayed_the_puts_go_again() -> None:
    """The broker's first connection ACKs every PUT with status byte 200 (no Status): the
    proxy used to relay those as outcomes (UNKNOWN) and drop the PUTs; now it drops that
    upstream connection, sends the PUTs again on the next one, and relays those ACKs
    (issue #33)."""
    acks = AckRecorder()
    with (
        FakeBroker(Script(None, bad_connections=1, bad_ack_status=200)) as fake,
        ProxyProcess(["--upstream", fake.address]) as proxy,
    ):
        with Session(proxy.address, options=FAST) as producer:
            queue = producer.open_queue(URI, write=True, on_ack=acks)
            guids = {queue.post(b"%d" % i) for i in range(10)}
            assert producer.flush(timeout=20)
            wait_until(lambda: len(acks) == 10, timeout=10, what="the ten ACKs")
        assert acks.with_status(AckStatus.SUCCESS) == guids
        assert fake.connections == 2
        assert "has status STATUS_200 (200)" in proxy.output
        assert proxy.terminate() == 0


@pytest.mark.timeout(90)
def test_repeated_bad_frames_never_wedge_the_proxy_a_real_broker_there_later_is_used() -> None:
    """The proxy keeps trying a broker whose connections all end in bad frames (with
    back-off, one ERROR line), and once a real broker answers on that address its
    clients are served: it used to fail its upstream session for good and stay up,
    unready, refusing every client until restarted by hand."""
    with contextlib.ExitStack() as stack:
        with FakeBroker(Script(push_with_short_guid)) as fake:
            port = fake.port
            proxy = stack.enter_context(ProxyProcess(["--upstream", fake.address]))
            with Session(proxy.address, options=FAST) as consumer:
                consumer.open_queue(URI, read=True, on_message=MessageRecorder())
                wait_until(
                    lambda: fake.connections > MAX_BAD_CONNECTIONS + 1,
                    timeout=30,
                    what="the proxy trying past the bad-connection limit",
                )
        assert "SessionFailed" not in proxy.output
        assert proxy.output.count("still trying, with back-off") == 1
        broker = stack.enter_context(BrokerProcess(port=port))
        acks = AckRecorder()
        with Session(proxy.address, options=FAST) as producer:
            queue = producer.open_queue(URI, write=True, on_ack=acks, timeout=30)
            guids = {queue.post(b"%d" % i) for i in range(10)}
            assert producer.flush(timeout=20)
        assert acks.with_status(AckStatus.SUCCESS) == guids
        assert broker.port == port
        assert proxy.terminate() == 0

"""The sidecar proxy between SDK sessions and a broker, all as real processes on 127.0.0.1.

Rule 10: an application connected to the proxy sees the same contract. When the
proxy loses the broker it keeps its clients connected and replays upstream with
the SDK's engine; when the proxy itself dies, the SDK's own reconnect rules apply.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable

import pytest

from holdfast.proto import pb
from holdfast.sdk import (
    AckStatus,
    ConfirmRejected,
    ConnectionLost,
    Message,
    QueueOptions,
    ReconnectOptions,
    Session,
    SessionOptions,
)
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.recorder import AckRecorder, EventRecorder, MessageRecorder
from tests.support.sessions import FAST, drain, unique_uri
from tests.support.waiting import wait_until
from tests.support.wire_client import StreamEnded, WireClient


def proxy_saw(proxy: ProxyProcess, text: str) -> bool:
    """Whether the proxy logged ``text`` (its upstream events are logged)."""
    return text in proxy.output


@pytest.mark.timeout(180)
def test_producer_through_the_proxy_while_the_broker_restarts(
    broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    """Memory store: messages the first broker ACKed die with it. The client never sees
    the outage; every PUT gets exactly one ACK, none twice."""
    total = 30_000
    acks, events = AckRecorder(), EventRecorder()
    uri = unique_uri("proxy-restart")
    with Session(proxy.address, on_event=events, options=FAST) as session:
        queue = session.open_queue(uri, write=True, on_ack=acks)
        posted = []
        for i in range(total):
            posted.append(queue.post(b"%06d" % i))
            if i == total // 3:
                broker.kill()
            elif i == total // 2:
                broker.restart()
        assert session.flush(timeout=120)
    assert acks.per_guid() == Counter({g: 1 for g in posted})
    # Nothing was older than the 300 s dedup window, so nothing ended UNKNOWN.
    assert acks.with_status(AckStatus.SUCCESS) == set(posted)
    assert events.of(ConnectionLost) == []  # the client stayed connected to the proxy
    wait_until(lambda: proxy_saw(proxy, "StateRestored"), 10, "the proxy's upstream restore")


@pytest.mark.timeout(180)
def test_proxy_killed_and_restarted_mid_stream_loses_and_duplicates_nothing(
    broker: BrokerProcess,
) -> None:
    total = 30_000
    acks = AckRecorder()
    uri = unique_uri("proxy-kill")
    with (
        ProxyProcess(["--upstream", broker.address]) as proxy,
        Session(proxy.address, options=FAST) as session,
    ):
        queue = session.open_queue(uri, write=True, on_ack=acks)
        posted = []
        for i in range(total):
            posted.append(queue.post(b"%06d" % i))
            if i == total // 3:
                proxy.kill()
            elif i == total // 2:
                proxy.restart()
        assert session.flush(timeout=120)
    assert acks.per_guid() == Counter({g: 1 for g in posted})
    assert acks.with_status(AckStatus.SUCCESS) == set(posted)
    # The broker stayed up, so it held every message, each exactly once.
    assert drain(broker.address, uri, total) == Counter({g: 1 for g in posted})


@pytest.mark.timeout(120)
def test_a_misbehaving_client_does_not_affect_another(
    broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    uri = unique_uri("neighbours")
    acks = AckRecorder()
    received = MessageRecorder()
    stop = threading.Event()
    posted: list[uuid.UUID] = []

    with Session(proxy.address, options=FAST) as good:
        good.open_queue(uri, read=True, on_message=received)
        queue = good.open_queue(uri, write=True, on_ack=acks)

        def produce() -> None:
            while not stop.is_set() and len(posted) < 20_000:
                posted.append(queue.post(b"%06d" % len(posted)))

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            for _ in range(3):
                with WireClient(proxy.address) as bad:
                    bad.hello()  # before it, bytes that do not parse end the stream
                    bad.send_raw(b"\xff\xfe not a frame")
                    assert bad.recv("error").error.status == pb.STATUS_MALFORMED_FRAME
                    assert bad.open(1, "not-a-uri", write=True).status == (
                        pb.STATUS_INVALID_ARGUMENT
                    )
                    assert bad.open(1, uri + "\n", write=True).status == (
                        pb.STATUS_INVALID_ARGUMENT
                    )
                    huge = bad.open(1, "hf://d/" + "\x00" * 3_000_000, write=True)
                    assert huge.status == pb.STATUS_INVALID_ARGUMENT
                    assert len(huge.message) < 400  # a bounded quote, not 12 MB of repr
                    assert bad.open(2, uri, write=True).status == pb.STATUS_OK
                    # A GUID column that is not 16 bytes a message cannot be split.
                    bad.put_columns(
                        pb.PutBatch(
                            queue_ids=[2], guids=b"short", payloads=b"x", payload_lengths=[1]
                        )
                    )
                    assert bad.recv("error").error.status == pb.STATUS_MALFORMED_FRAME
                    # Nor one whose property group names a message past its end.
                    bad.put_columns(
                        pb.PutBatch(
                            queue_ids=[2],
                            guids=uuid.uuid4().bytes,
                            payloads=b"x",
                            payload_lengths=[1],
                            property_groups=[
                                pb.PropertyGroup(indexes=[3], keys=["k"], values=["v"])
                            ],
                        )
                    )
                    assert bad.recv("error").error.status == pb.STATUS_MALFORMED_FRAME
                    bad.confirm(2, [uuid.uuid4().bytes])
                    assert bad.recv("error").error.status == pb.STATUS_NOT_READABLE
                    bad.send(pb.ClientFrame(hello=pb.Hello(protocol_version=1)))
                    assert bad.recv("error").error.status == pb.STATUS_PROTOCOL_ERROR
                # ...and leave abruptly, mid-conversation.
                with WireClient(proxy.address) as rude:
                    rude.hello()
                    rude.open(7, uri, read=True)
        finally:
            stop.set()
            producer.join(30)
        assert good.flush(timeout=60)
        wait_until(lambda: set(received.guids()) >= set(posted), 60, "every message consumed")
    assert acks.with_status(AckStatus.SUCCESS) == set(posted)
    assert acks.per_guid() == Counter({g: 1 for g in posted})


@pytest.mark.timeout(120)
def test_a_departing_consumer_releases_its_messages_to_another(
    broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    uri = unique_uri("release")
    with Session(proxy.address, options=FAST) as producer:
        queue = producer.open_queue(uri, write=True)
        posted = [queue.post(b"%03d" % i) for i in range(50)]
        assert producer.flush(timeout=30)
    held = MessageRecorder(confirm=False)
    with Session(proxy.address, options=FAST) as first:
        first.open_queue(
            uri, read=True, on_message=held, options=QueueOptions(max_unconfirmed_messages=10)
        )
        wait_until(lambda: len(held) == 10, 10, "the first consumer's 10 messages")
    # The first consumer left without confirming: its 10 go to the next one.
    second = MessageRecorder()
    with Session(proxy.address, options=FAST) as other:
        other.open_queue(uri, read=True, on_message=second)
        wait_until(lambda: set(second.guids()) == set(posted), 30, "all 50 messages")
    redelivered = {m.guid for m in second.messages if m.delivery_count == 2}
    assert redelivered == {m.guid for m in held.messages}


@pytest.mark.timeout(120)
def test_confirm_of_a_delivery_from_an_earlier_upstream_connection_is_stale(
    broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    """The client's link to the proxy never drops, but the proxy's link to the broker
    does: the broker redelivers the message, a CONFIRM of the redelivery settles it
    although the client still holds the older delivery, and the CONFIRM of the older,
    stale delivery is refused."""
    uri = unique_uri("stale")
    with Session(proxy.address, options=FAST) as producer:
        queue = producer.open_queue(uri, write=True)
        queue.post(b"only")
        queue.post(b"next")
        assert producer.flush(timeout=10)
    events = EventRecorder()
    held = MessageRecorder(confirm=False)
    options = SessionOptions(reconnect=ReconnectOptions(initial=0.02, maximum=0.2))
    with Session(proxy.address, on_event=events, options=options) as consumer:
        # One unconfirmed message at a time: "next" comes only once "only" is settled.
        consumer.open_queue(
            uri, read=True, on_message=held, options=QueueOptions(max_unconfirmed_messages=1)
        )
        wait_until(lambda: len(held) == 1, 10, "the first delivery")
        first: Message = held.messages[0]
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: proxy_saw(proxy, "ConnectionLost"), 15, "the proxy to notice")
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        wait_until(lambda: proxy_saw(proxy, "StateRestored"), 15, "the proxy to reconnect")
        wait_until(lambda: len(held) == 2, 30, "the redelivery")
        again = held.messages[1]
        assert (again.guid, again.delivery_count) == (first.guid, 2)
        # Settling the client's oldest delivery of the GUID (the stale one) instead
        # would refuse this CONFIRM and leave the message outstanding here for good.
        again.confirm()
        wait_until(lambda: len(held) == 3, 10, "the next message, once the first is settled")
        first.confirm()  # the client's own link is fine, so the SDK sends it
        wait_until(lambda: events.of(ConfirmRejected), 10, "the stale CONFIRM to be refused")
        held.messages[2].confirm()
    assert held.messages[2].payload == b"next"
    assert events.of(ConnectionLost) == []
    [rejected] = events.of(ConfirmRejected)
    assert isinstance(rejected, ConfirmRejected) and rejected.guids == (first.guid,)
    assert drain(broker.address, uri, 0) == Counter()


@pytest.mark.timeout(120)
def test_stale_confirms_after_a_broker_outage_do_not_end_the_client(
    broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    """A client holding many deliveries when the proxy's upstream reconnects confirms
    them all: each is refused as stale (ConfirmRejected), yet none counts against its
    refused-CONFIRM limit (100 a second): the outage was the proxy's, which rule 10
    hides from the client, so the client stays connected. Without that the proxy ended
    the session ("this client confirms what it does not hold")."""
    uri, total = unique_uri("stale-many"), 300
    with Session(proxy.address, options=FAST) as producer:
        queue = producer.open_queue(uri, write=True)
        for i in range(total):
            queue.post(b"%03d" % i)
        assert producer.flush(timeout=10)
    events = EventRecorder()
    held = MessageRecorder(confirm=False)
    with Session(proxy.address, on_event=events, options=FAST) as consumer:
        consumer.open_queue(uri, read=True, on_message=held)
        wait_until(lambda: len(held) == total, 10, "every first delivery")
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: proxy_saw(proxy, "ConnectionLost"), 15, "the proxy to notice")
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        wait_until(lambda: len(held) == 2 * total, 30, "every redelivery")
        # The CONFIRM of a stale delivery settles the redelivery the client also holds
        # (it processed the message either way); the second CONFIRM of each GUID finds
        # only the stale delivery left, and is refused.
        for message in held.messages:
            message.confirm()

        def refused() -> int:
            return sum(
                len(e.guids) for e in events.of(ConfirmRejected) if isinstance(e, ConfirmRejected)
            )

        wait_until(lambda: refused() == total, 10, "the stale CONFIRMs to be refused")
        assert consumer.flush(timeout=10)
    assert events.of(ConnectionLost) == []
    assert "confirms what it does not hold" not in proxy.output
    assert drain(broker.address, uri, 0) == Counter()


def test_the_proxy_forwards_the_brokers_dedup_window_and_limits(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory("--dedup-window", "42", "--max-payload-bytes", "1000")
    with ProxyProcess(["--upstream", broker.address]) as proxy, WireClient(proxy.address) as client:
        reply = client.hello()
    assert reply.dedup_window_ms == 42_000
    assert reply.max_payload_bytes == 1000


def test_an_old_client_is_refused_by_the_proxy_and_a_columnar_batch_is_relayed(
    proxy: ProxyProcess,
) -> None:
    for version in (1, 2):  # a message per row; a map of properties per message
        with WireClient(proxy.address) as old:
            old.send_hello(protocol_version=version)
            error = old.recv("error").error
            assert (error.status, error.fatal) == (pb.STATUS_VERSION_MISMATCH, True)
            assert f"protocol version {version}" in error.message
    uri = unique_uri("columns")
    with WireClient(proxy.address) as client:
        client.hello()
        assert client.open(1, uri, write=True, read=True).status == pb.STATUS_OK
        guids = [uuid.uuid4().bytes for _ in range(3)]
        client.put(1, [(guids[0], b"a", {}), (guids[1], b"bb", {"k": "v"}), (guids[2], b"", {})])
        assert [(a.guid, a.status) for a in client.acks(3)] == [(g, pb.STATUS_OK) for g in guids]
        pushes = client.pushes(3)
        assert sorted((p.guid, p.payload, dict(p.properties)) for p in pushes) == sorted(
            [(guids[0], b"a", {}), (guids[1], b"bb", {"k": "v"}), (guids[2], b"", {})]
        )
        assert {p.delivery_count for p in pushes} == {1}


def test_the_proxy_fails_over_across_its_upstream_list_in_order(
    broker: BrokerProcess, free_port: int
) -> None:
    upstream = f"127.0.0.1:{free_port},{broker.address}"
    with ProxyProcess(["--upstream", upstream]) as proxy:
        with Session(proxy.address, options=FAST) as session:
            session.open_queue(unique_uri("failover"), write=True).post(b"x")
            assert session.flush(timeout=20)
        log = proxy.output
    assert log.index(f"cannot connect to 127.0.0.1:{free_port}:") < log.index(
        f"Connected(address='{broker.address}'"
    )


def test_sigterm_stops_the_proxy_gracefully(broker: BrokerProcess) -> None:
    proxy = ProxyProcess(["--upstream", broker.address]).start()
    try:
        with WireClient(proxy.address) as client:
            client.hello()
            assert proxy.terminate() == 0
            error = client.recv("error").error
        assert (error.status, error.fatal) == (pb.STATUS_SHUTTING_DOWN, True)
    finally:
        proxy.close()


@pytest.mark.timeout(60)
def test_two_clients_posting_one_pending_guid_each_get_their_ack(
    broker: BrokerProcess, proxy: ProxyProcess
) -> None:
    """Two live clients (say, a Spark task and its speculative copy) post the same GUID
    while the broker is away: the proxy sends it upstream once, and each client gets
    its ACK; the queue holds the message once."""
    uri = unique_uri("shared-guid")
    guid = uuid.uuid4().bytes
    with WireClient(proxy.address) as first, WireClient(proxy.address) as second:
        for client in (first, second):
            client.hello()
            assert client.open(1, uri, write=True).status == pb.STATUS_OK
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: proxy_saw(proxy, "ConnectionLost"), 15, "the proxy to notice")
            first.put(1, [(guid, b"once", {})])
            second.put(1, [(guid, b"once", {})])
            first.barrier(10)
            second.barrier(10)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert [a.status for a in first.acks(1, timeout=30)] == [pb.STATUS_OK]
        assert [a.status for a in second.acks(1, timeout=30)] == [pb.STATUS_OK]
    assert drain(broker.address, uri, 1) == Counter({uuid.UUID(bytes=guid): 1})


@pytest.mark.timeout(60)
def test_a_proxy_whose_broker_answers_late_announces_only_the_brokers_limits(
    free_port: int,
) -> None:
    """No broker yet: the client's Hello is never answered with limits of the proxy's
    own (a proxy once answered with defaults): once an attempt to reach the broker has
    failed, the stream ends UNAVAILABLE naming the upstream and why; once the broker
    answers, a client gets the broker's own window."""
    with ProxyProcess(["--upstream", f"127.0.0.1:{free_port}"]) as proxy:
        with WireClient(proxy.address) as client:
            client.send_hello()
            with pytest.raises(StreamEnded) as ended:
                client.recv("hello_reply", timeout=10)
        assert "the proxy reaches no broker" in str(ended.value)
        assert f"127.0.0.1:{free_port}" in str(ended.value)
        with BrokerProcess(["--dedup-window", "6"], port=free_port):

            def greeted() -> bool:
                with WireClient(proxy.address) as client, contextlib.suppress(StreamEnded):
                    client.send_hello()
                    reply.append(client.recv("hello_reply", timeout=10).hello_reply)
                return bool(reply)

            reply: list[pb.HelloReply] = []
            wait_until(greeted, 30, "a HelloReply")
    assert reply[0].dedup_window_ms == 6_000


@pytest.mark.parametrize("path", ["direct", "proxy"])
def test_the_same_guid_twice_in_one_batch_gets_one_ack_per_put(
    broker: BrokerProcess, proxy: ProxyProcess, path: str
) -> None:
    uri = unique_uri("twice")
    guid = uuid.uuid4().bytes
    address = broker.address if path == "direct" else proxy.address
    with WireClient(address) as client:
        client.hello()
        assert client.open(1, uri, write=True).status == pb.STATUS_OK
        client.put(1, [(guid, b"same", {}), (guid, b"same", {})])
        acks = client.acks(2, timeout=20)
        assert [(a.guid, a.status) for a in acks] == [(guid, pb.STATUS_OK)] * 2
        assert client.quiet("acks", 0.3) == []
    assert drain(broker.address, uri, 1) == Counter({uuid.UUID(bytes=guid): 1})

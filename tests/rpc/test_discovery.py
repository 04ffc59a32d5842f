"""Service discovery: ``Session.has_workers`` answered by the broker from live consumers
(CountConsumers), directly and through the proxy."""

from __future__ import annotations

import pytest

from holdfast.proto import pb
from holdfast.sdk import InvalidQueueUriError, Session, Worker
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until
from tests.support.wire_client import WireClient


@pytest.mark.parametrize("via_proxy", [False, True], ids=["direct", "proxy"])
def test_has_workers_follows_live_consumers(
    broker: BrokerProcess, proxy: ProxyProcess, via_proxy: bool
) -> None:
    address = proxy.address if via_proxy else broker.address
    uri = unique_uri("service")
    with (
        Session(address, options=FAST) as caller,
        Session(address, options=FAST) as worker_session,
    ):
        assert caller.has_workers(uri) is False  # a queue nobody opened
        worker_session.open_queue(uri, write=True)
        assert caller.has_workers(uri) is False  # a producer is not a worker
        worker = Worker(worker_session, uri, lambda r: b"")
        assert caller.has_workers(uri) is True
        worker.close()
        assert caller.has_workers(uri) is False


def test_a_closed_worker_session_leaves_no_consumer(broker: BrokerProcess) -> None:
    uri = unique_uri("service")
    with Session(broker.address, options=FAST) as caller:
        worker_session = Session(broker.address, options=FAST)
        Worker(worker_session, uri, lambda r: b"")
        assert caller.has_workers(uri)
        worker_session.close(timeout=0)
        wait_until(lambda: not caller.has_workers(uri), 10, "the consumer to go")


def test_has_workers_refuses_a_bad_uri(broker: BrokerProcess) -> None:
    with Session(broker.address, options=FAST) as caller, pytest.raises(InvalidQueueUriError):
        caller.has_workers("not-a-uri")


@pytest.mark.parametrize("via_proxy", [False, True], ids=["direct", "proxy"])
def test_count_consumers_on_the_wire(
    broker: BrokerProcess, proxy: ProxyProcess, via_proxy: bool
) -> None:
    """The frame pair itself: a bad URI gets INVALID_ARGUMENT with a bounded message."""
    with WireClient(proxy.address if via_proxy else broker.address) as client:
        client.hello()
        client.send(
            pb.ClientFrame(count_consumers=pb.CountConsumers(request_id=7, uri="x" * 10_000))
        )
        answer = client.recv("consumer_count").consumer_count
        assert (answer.request_id, answer.status) == (7, pb.STATUS_INVALID_ARGUMENT)
        assert len(answer.message) <= 300
        client.send(pb.ClientFrame(count_consumers=pb.CountConsumers(request_id=8, uri="hf://a/b")))
        answer = client.recv("consumer_count").consumer_count
        assert (answer.request_id, answer.status, answer.consumers) == (8, pb.STATUS_OK, 0)

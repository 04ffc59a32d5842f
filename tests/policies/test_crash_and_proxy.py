"""Dead-letter moves across a kill -9 (sqlite), and REJECTs through the proxy."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import QueueOptions, Session
from holdfast.sdk.admin import AdminClient
from tests.policies.support import FAST, Collector, DeadLetterer, drain, post_all, ready
from tests.support.processes import BrokerProcess, ProxyProcess

URI = "hf://shop/orders"
DLQ = "hf://shop/orders.dlq"
COUNT = 3000


@pytest.mark.timeout(120)
def test_nothing_is_lost_or_duplicated_when_the_broker_dies_mid_move(tmp_path: Path) -> None:
    with BrokerProcess(["--store", f"sqlite:{tmp_path / 'b.db'}"]) as broker:
        with AdminClient(broker.address) as admin:
            admin.set_policy(URI, QueuePolicy(dead_letter=DLQ))
        reject = DeadLetterer(after=COUNT // 3)  # then the broker is killed
        with Session(broker.address, options=FAST) as session:
            guids = post_all(session, URI, [b"m%d" % i for i in range(COUNT)])
            session.open_queue(
                URI,
                read=True,
                on_message=reject,
                options=QueueOptions(max_unconfirmed_messages=50),
            )
            assert reject.reached.wait(30)
            broker.kill()  # SIGKILL while REJECTs and their moves are on their way
        broker.restart()
        with AdminClient(broker.address) as admin:
            in_queue, in_dlq = admin.stats(URI), ready(admin, DLQ)
            assert 0 < in_dlq < COUNT
            assert in_queue.ready + in_dlq == COUNT
        collectors = drain(broker.address, (URI, DLQ), COUNT)
    seen = Counter(guid for c in collectors.values() for guid in c.guids())
    assert seen == Counter({guid: 1 for guid in guids})


@pytest.mark.timeout(60)
def test_rejects_travel_through_the_proxy() -> None:
    got = Collector(confirm=False)
    dead = Collector()
    with (
        BrokerProcess() as broker,
        ProxyProcess(["--upstream", broker.address]) as proxy,
        AdminClient(broker.address) as admin,
    ):
        admin.set_policy(URI, QueuePolicy(dead_letter=DLQ, max_deliveries=2))
        with Session(proxy.address, options=FAST) as session:
            (guid,) = post_all(session, URI, [b"m"])
            session.open_queue(URI, read=True, on_message=got)
            got.wait_for(1)[0].reject(requeue=True)
            got.wait_for(2)[1].reject(requeue=True)  # the second delivery was the last
            session.open_queue(DLQ, read=True, on_message=dead)
            (letter,) = dead.wait_for(1)
    assert [m.delivery_count for m in got.messages] == [1, 2]
    assert letter.guid == guid
    assert letter.properties["x-death-reason"] == "delivery-limit"

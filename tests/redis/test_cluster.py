"""The cluster form: ``redis+cluster://``, three primaries made with ``redis-cli
--cluster create``, queues spread over them (each queue's keys in one slot)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import Session
from holdfast.sdk.admin import AdminClient
from tests.policies.support import Collector
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer, redis_cluster
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[RedisServer]]:
    with redis_cluster(tmp_path) as servers:
        yield servers


def test_two_nodes_on_a_cluster_with_a_queue_on_each_primary(cluster: list[RedisServer]) -> None:
    store = "redis+cluster://" + ",".join(s.address for s in cluster[:2])
    uris = [f"hf://cluster/q{i}" for i in range(12)]
    with (
        BrokerProcess(["--store", store]) as a,
        BrokerProcess(["--store", store]) as b,
        Session(a.address, options=FAST) as producer,
        Session(b.address, options=FAST) as consumer,
    ):
        posted: dict[str, list[uuid.UUID]] = {uri: [] for uri in uris}
        queues = {uri: producer.open_queue(uri, write=True) for uri in uris}
        for i in range(200):
            for uri, queue in queues.items():
                posted[uri].append(queue.post(b"%d" % i))
        assert producer.flush(timeout=60)
        got = {uri: Collector() for uri in uris}
        for uri, collector in got.items():
            consumer.open_queue(uri, read=True, on_message=collector)
        for collector in got.values():
            collector.wait_for(200, timeout=30)
    assert all(int(s.cli("DBSIZE")) > 0 for s in cluster)  # every primary holds queues
    for uri in uris:
        assert Counter(got[uri].guids()) == Counter({g: 1 for g in posted[uri]})


def test_dead_letters_move_between_primaries(cluster: list[RedisServer]) -> None:
    store = "redis+cluster://" + cluster[0].address
    sources = [f"hf://cluster/s{i}" for i in range(6)]
    dlq = "hf://cluster/dead"
    with (
        BrokerProcess(["--store", store]) as a,
        BrokerProcess(["--store", store]) as b,
        AdminClient(a.address) as admin,
        AdminClient(b.address) as admin_b,
        Session(a.address, options=FAST) as session,
    ):
        # Through the node that delivers: on a cluster the others learn of a policy at
        # their next heartbeat (there is no pub/sub announcement).
        for uri in sources:
            admin.set_policy(uri, QueuePolicy(max_deliveries=1, dead_letter=dlq))
        posted = [session.open_queue(uri, write=True).post(b"x") for uri in sources]
        assert session.flush(timeout=30)
        rejecting = Collector(confirm=False)
        for uri in sources:
            session.open_queue(uri, read=True, on_message=rejecting)
        for message in rejecting.wait_for(len(sources)):
            message.reject(requeue=True)  # its one delivery is spent: dead on return
        dead = Collector()
        session.open_queue(dlq, read=True, on_message=dead)
        dead.wait_for(len(sources))

        def settled() -> bool:
            # The dead-letter counters are added after the move (one HINCRBY each, spawned
            # by the node that moved them), so they may land just after the copies do.
            stats = [admin_b.stats(uri) for uri in sources]
            return [(s.ready, s.dead_lettered) for s in stats] == [(0, 1)] * len(sources)

        wait_until(settled, 10, "every source to count its dead letter")
    assert Counter(dead.guids()) == Counter({g: 1 for g in posted})
    assert {m.properties["x-original-uri"] for m in dead.messages} == set(sources)

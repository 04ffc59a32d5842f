"""Broker nodes on one Redis (issue #13): active-active queues, a node's death, Redis
outages and restarts, replicas. Every test starts its own redis-server and brokers."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

from holdfast.sdk import Ack, AckStatus, QueueOptions, Session
from tests.policies.support import Collector
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

URI = "hf://shared/orders"


class Acks:
    """``on_ack`` that counts ACKs per GUID."""

    def __init__(self) -> None:
        self.statuses: dict[uuid.UUID, list[AckStatus]] = {}
        self._lock = threading.Lock()

    def __call__(self, ack: Ack) -> None:
        with self._lock:
            self.statuses.setdefault(ack.guid, []).append(ack.status)

    def exactly_one_success(self, guids: list[uuid.UUID]) -> None:
        assert {g: self.statuses.get(g) for g in guids} == {g: [AckStatus.SUCCESS] for g in guids}


def test_two_nodes_serve_one_queue_exactly_once(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url]) as a,
        BrokerProcess(["--store", redis.url]) as b,
        Session(a.address, options=FAST) as producer,
        Session(b.address, options=FAST) as consumer,
    ):
        acks = Acks()
        queue = producer.open_queue(URI, write=True, on_ack=acks)
        guids = [queue.post(b"m%d" % i) for i in range(5000)]
        assert producer.flush(timeout=30)
        got = Collector()
        consumer.open_queue(URI, read=True, on_message=got)
        got.wait_for(5000)
        assert producer.has_workers(URI)  # node A counts node B's consumer
        assert queue.post(b"m0", guid=guids[0])  # a replay through node A...
        assert producer.flush(timeout=10)
    acks.exactly_one_success(guids[1:])
    assert acks.statuses[guids[0]] == [AckStatus.SUCCESS, AckStatus.SUCCESS]
    assert Counter(got.guids()) == Counter({g: 1 for g in guids})  # ...not delivered twice


def test_a_dead_nodes_deliveries_are_redelivered_by_another(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url]) as a,
        BrokerProcess(["--store", redis.url]) as b,
    ):
        with Session(b.address, options=FAST) as producer:
            guids = [producer.open_queue(URI, write=True).post(b"m%d" % i) for i in range(1)]
            queue = producer.open_queue(URI, write=True)
            guids += [queue.post(b"m%d" % i) for i in range(1, 100)]
            assert producer.flush(timeout=30)
        held = Collector(confirm=False)
        holder = Session(a.address, options=FAST)
        holder.open_queue(
            URI, read=True, on_message=held, options=QueueOptions(max_unconfirmed_messages=100)
        )
        held.wait_for(100)
        a.kill()  # kill -9 with 100 deliveries unconfirmed
        again = Collector()
        with Session(b.address, options=FAST) as survivor:
            survivor.open_queue(URI, read=True, on_message=again)
            # The bound: 3 missed heartbeats of 1 s, plus one reaping pass.
            again.wait_for(100, timeout=8)
        holder.close(timeout=1)
    assert sorted(again.guids()) == sorted(guids)
    assert {m.delivery_count for m in again.messages} == {2}


def test_three_nodes_behind_a_proxy_through_three_node_kills(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as redis:
        nodes = [BrokerProcess(["--store", redis.url]).start() for _ in range(3)]
        try:
            upstream = ",".join(node.address for node in nodes)
            with (
                ProxyProcess(["--upstream", upstream]) as proxy,
                Session(proxy.address, options=FAST) as producer,
                Session(nodes[2].address, options=FAST) as consumer,
            ):
                acks = Acks()
                got = Collector()
                consumer.open_queue(URI, read=True, on_message=got)
                queue = producer.open_queue(URI, write=True, on_ack=acks)
                guids: list[uuid.UUID] = []
                for round_ in range(3):
                    guids += [queue.post(b"r%d-%d" % (round_, i)) for i in range(1000)]
                    victim = nodes[round_ % 2]  # the proxy's current upstream, or the next
                    victim.kill()
                    guids += [queue.post(b"r%d-late-%d" % (round_, i)) for i in range(500)]
                    victim.restart()
                assert producer.flush(timeout=60)
                got.wait_for(len(guids), timeout=60)
        finally:
            for node in nodes:
                node.close()
    acks.exactly_one_success(guids)
    assert Counter(got.guids()) == Counter({g: 1 for g in guids})


def test_a_redis_restart_with_aof_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url]) as broker,
        Session(broker.address, options=FAST) as session,
    ):
        acks = Acks()
        queue = session.open_queue(URI, write=True, on_ack=acks)
        guids = [queue.post(b"m%d" % i) for i in range(2000)]
        redis.kill()  # mid-stream: some PUTs were taken, some wait for Redis
        guids += [queue.post(b"n%d" % i) for i in range(1000)]
        redis.restart()
        assert session.flush(timeout=60)
        got = Collector()
        session.open_queue(URI, read=True, on_message=got)
        try:
            got.wait_for(len(guids), timeout=30)
        except AssertionError:
            keys = "hf:{" + URI + "}:"
            raise AssertionError(
                f"got {len(got.messages)}; ready {redis.cli('LLEN', keys + 'ready')}, "
                f"bodies {redis.cli('HLEN', keys + 'body')}; broker log:\n{broker.output[-1500:]}"
            ) from None
        # Known open issue (#32 note): a kill -9 of Redis in the middle of a PUT stream
        # was once reported LOST DATA though AOF kept everything (a false alarm: every
        # message below is there, once). What must hold is the data.
    acks.exactly_one_success(guids)
    assert Counter(got.guids()) == Counter({g: 1 for g in guids})


def test_redis_losing_its_data_is_reported_loudly(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis", aof=False) as redis,
        BrokerProcess(["--store", redis.url]) as broker,
        Session(broker.address, options=FAST) as session,
    ):
        session.open_queue(URI, write=True).post(b"soon gone")
        assert session.flush(timeout=10)
        redis.restart(wipe=True)  # no persistence: everything is gone
        wait_until(lambda: "LOST DATA" in broker.output, 15, "the data-loss report")
        assert "ERROR" in broker.output.split("LOST DATA")[0].splitlines()[-1]


def test_outages_shorter_than_the_retry_window_lose_nothing_longer_fail_typed(
    tmp_path: Path,
) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url, "--redis-retry", "3"]) as broker,
        Session(broker.address, options=FAST) as session,
    ):
        acks = Acks()
        queue = session.open_queue(URI, write=True, on_ack=acks)
        redis.kill()
        short = [queue.post(b"short-%d" % i) for i in range(100)]
        redis.restart()  # within the 3 s window
        assert session.flush(timeout=30)
        acks.exactly_one_success(short)
        redis.kill()
        long = [queue.post(b"long-%d" % i) for i in range(100)]
        assert session.flush(timeout=30)  # past the window: refused, typed
        assert {s for g in long for s in acks.statuses[g]} == {AckStatus.STORE_ERROR}
        redis.restart()
        after = queue.post(b"after")
        assert session.flush(timeout=30)
        assert acks.statuses[after] == [AckStatus.SUCCESS]
        got = Collector()
        session.open_queue(URI, read=True, on_message=got)
        got.wait_for(101)
    assert sorted(m.payload for m in got.messages) == sorted(
        [b"short-%d" % i for i in range(100)] + [b"after"]
    )


def test_min_replicas_acks_unknown_when_the_replica_is_gone(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "primary") as primary:
        replica = RedisServer(
            tmp_path / "replica", extra=("--replicaof", "127.0.0.1", str(primary.port))
        ).start()
        try:
            wait_until(
                lambda: "state=online" in primary.cli("INFO", "replication"),
                15,
                "the replica to be in sync",
            )
            with (
                BrokerProcess(["--store", primary.url, "--redis-min-replicas", "1"]) as broker,
                Session(broker.address, options=FAST) as session,
            ):
                acks = Acks()
                queue = session.open_queue(URI, write=True, on_ack=acks)
                replicated = [queue.post(b"r%d" % i) for i in range(200)]
                assert session.flush(timeout=30)
                acks.exactly_one_success(replicated)
                replica.kill()
                wait_until(
                    lambda: "connected_slaves:0" in primary.cli("INFO", "replication"),
                    15,
                    "the replica gone",
                )
                alone = queue.post(b"alone")
                assert session.flush(timeout=30)
                assert acks.statuses[alone] == [AckStatus.UNKNOWN]
        finally:
            replica.stop()


def post_unknown(address: str, count: int) -> list[uuid.UUID]:
    """Post ``count`` PUTs to ``URI`` through the broker at ``address``: each must be
    ACKed once, UNKNOWN (stored, not yet on the replicas ``--redis-min-replicas`` asks)."""
    with Session(address, options=FAST) as session:
        acks = Acks()
        queue = session.open_queue(URI, write=True, on_ack=acks)
        posted = [queue.post(b"h%d" % i) for i in range(count)]
        assert session.flush(timeout=30)
    assert all(acks.statuses[g] == [AckStatus.UNKNOWN] for g in posted)
    return posted


def test_a_wait_that_fails_after_the_store_acks_unknown_not_store_error(tmp_path: Path) -> None:
    # STORE_ERROR promises the PUT was not stored, and a producer may post it again
    # under a new GUID; the script ran before the WAIT of its pipeline failed.
    with RedisServer(tmp_path / "redis", aof=False) as primary:
        assert primary.cli("ACL", "SETUSER", "holdfast", "on", ">pw", "~*", "&*", "+@all", "-wait")
        url = f"redis://holdfast:pw@{primary.address}"
        with BrokerProcess(["--store", url, "--redis-min-replicas", "1"]) as broker:
            post_unknown(broker.address, 20)
        assert "WAIT failed after a store" in broker.output
        assert int(primary.cli("LLEN", f"hf:{{{URI}}}:unsynced")) == 20


def test_held_messages_are_delivered_once_after_a_restart_without_min_replicas(
    tmp_path: Path,
) -> None:
    # PUTs ACKed UNKNOWN under --redis-min-replicas 1 wait in the unsynced list; nodes
    # restarted without it (nothing to wait for) used to never look at that list again.
    with RedisServer(tmp_path / "redis") as redis:
        with BrokerProcess(["--store", redis.url, "--redis-min-replicas", "1"]) as held:
            posted = post_unknown(held.address, 300)
        assert int(redis.cli("LLEN", f"hf:{{{URI}}}:unsynced")) == 300
        with (
            BrokerProcess(["--store", redis.url]) as a,
            BrokerProcess(["--store", redis.url]) as b,
            Session(a.address, options=FAST) as first,
            Session(b.address, options=FAST) as second,
        ):
            got = Collector()
            first.open_queue(URI, read=True, on_message=got)
            second.open_queue(URI, read=True, on_message=got)
            got.wait_for(300, timeout=20)
            body = f"hf:{{{URI}}}:body"
            wait_until(lambda: int(redis.cli("HLEN", body)) == 0, 15, "every message confirmed")
            assert int(redis.cli("LLEN", f"hf:{{{URI}}}:unsynced")) == 0
            assert int(redis.cli("LLEN", f"hf:{{{URI}}}:ready")) == 0
    assert Counter(got.guids()) == Counter({g: 1 for g in posted})

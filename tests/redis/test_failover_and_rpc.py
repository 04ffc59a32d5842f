"""A primary lost and its replica promoted with ``--redis-min-replicas 1``; request/reply
across nodes on one Redis."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from holdfast.sdk import AckStatus, Request, Session, Worker
from tests.policies.support import Collector
from tests.redis.test_nodes import URI, Acks
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


def test_a_promoted_replica_has_every_message_acked_with_min_replicas(tmp_path: Path) -> None:
    """The primary is SIGKILLed after 2000 ACKed PUTs; its replica is promoted and a new
    broker serves from it. Every PUT ACKed SUCCESS is there, once (what was lost: none
    of the ACKed ones; PUTs ACKed UNKNOWN may or may not be)."""
    primary = RedisServer(tmp_path / "primary").start()
    replica = RedisServer(
        tmp_path / "replica", extra=("--replicaof", "127.0.0.1", str(primary.port))
    ).start()
    try:
        wait_until(lambda: "state=online" in primary.cli("INFO", "replication"), 15, "the replica")
        acks = Acks()
        with (
            BrokerProcess(["--store", primary.url, "--redis-min-replicas", "1"]) as first,
            Session(first.address, options=FAST) as session,
        ):
            queue = session.open_queue(URI, write=True, on_ack=acks)
            guids = [queue.post(b"m%d" % i) for i in range(2000)]
            assert session.flush(timeout=30)
        primary.kill()
        assert replica.cli("REPLICAOF", "NO", "ONE") == "OK"
        acked = [g for g in guids if acks.statuses.get(g) == [AckStatus.SUCCESS]]
        assert len(acked) == len(guids)  # the replica confirmed each in time
        got = Collector()
        with (
            BrokerProcess(["--store", replica.url]) as second,
            Session(second.address, options=FAST) as session,
        ):
            session.open_queue(URI, read=True, on_message=got)
            got.wait_for(len(acked), timeout=30)
            assert "LOST DATA" not in second.output  # the generation was replicated too
    finally:
        replica.stop()
        primary.stop()
    assert Counter(got.guids()) == Counter({g: 1 for g in acked})


def test_request_reply_across_nodes(tmp_path: Path) -> None:
    def echo(request: Request) -> bytes:
        return b"echo:" + request.payload

    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url]) as a,
        BrokerProcess(["--store", redis.url]) as b,
        Session(b.address, options=FAST) as worker_session,
        Worker(worker_session, "hf://svc/echo", echo, concurrency=4),
        Session(a.address, options=FAST) as caller,
    ):
        # The worker is on the other node, which publishes its consumer count to Redis
        # right after the open (not before answering it): visible here a moment later.
        wait_until(lambda: caller.has_workers("hf://svc/echo"), 10, "the worker to show")
        calls = [caller.request_async("hf://svc/echo", b"%d" % i, timeout=30) for i in range(200)]
        assert [f.result().payload for f in calls] == [b"echo:%d" % i for i in range(200)]

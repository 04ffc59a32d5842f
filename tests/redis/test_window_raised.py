"""Redis nodes restarted with a longer ``--dedup-window``: the history keys written under
the shorter one expired on their own TTL, so a replay older than it is TOO_OLD (it may
have been forgotten), not a new message, until the longer window has passed since the
change (``holdfast.broker.redis.cover``). Fresh PUTs are taken as ever."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from redis import StrictRedis

from holdfast.proto import pb
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until
from tests.support.wire_client import WireClient

pytestmark = pytest.mark.timeout(90)

URI = "hf://window/raised"


def test_a_replay_older_than_the_history_kept_is_too_old_after_the_window_grew(
    tmp_path: Path,
) -> None:
    guid, fresh = uuid.uuid4().bytes, uuid.uuid4().bytes
    history = "hf:{" + URI + "}:g:*"
    with RedisServer(tmp_path / "redis", aof=False) as redis:
        short = ["--store", redis.url, "--dedup-window", "1", "--dedup-grace", "0.5"]
        with BrokerProcess(short) as broker, WireClient(broker.address) as client:
            client.hello()
            assert client.open(1, URI, write=True, read=True).status == pb.STATUS_OK
            posted = time.monotonic()
            client.put(1, [(guid, b"once", {})])
            assert [a.status for a in client.acks(1)] == [pb.STATUS_OK]
            (push,) = client.pushes(1)
            client.confirm(1, [push.guid])
            client.barrier()
        plain = StrictRedis(port=redis.port)
        try:
            wait_until(lambda: not list(plain.scan_iter(match=history)), 15, "history gone")
        finally:
            plain.close()
        long = ["--store", redis.url, "--dedup-window", "300", "--dedup-grace", "0.5"]
        with BrokerProcess(long) as broker, WireClient(broker.address) as client:
            assert client.hello().dedup_window_ms == 300_000
            assert client.open(1, URI, write=True).status == pb.STATUS_OK
            age_ms = round((time.monotonic() - posted) * 1000)
            client.put(1, [(guid, b"once", {})], age_ms=age_ms)
            client.put(1, [(fresh, b"new", {})], age_ms=100)
            statuses = {ack.guid: ack.status for ack in client.acks(2)}
        assert statuses == {guid: pb.STATUS_TOO_OLD, fresh: pb.STATUS_OK}
        assert redis.cli("HGET", "hf:history-cover", "retention_ms") == "300500"

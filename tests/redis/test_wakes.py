"""Wakes between nodes on one Redis (issue #33): a PUT publishes ``hf:wake`` only when
some node has consumers of its queue. Every node's subscriber reads every wake, so a
wake per PUT frame on a queue nobody consumes cost each node of two more than its own
PUTs did (``bench/redisscale.py``); a consumer on another node is still woken."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from holdfast.broker.redis.keys import WAKE, QueueKeys
from holdfast.sdk import Session
from tests.policies.support import Collector
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

URI = "hf://shared/wakes"


def _wakes(pubsub: redis.client.PubSub) -> list[bytes]:
    """The wakes published since the last look (their queue URIs)."""
    seen: list[bytes] = []
    while (message := pubsub.get_message(timeout=0.2)) is not None:
        if message["type"] == "message":
            seen.append(message["data"])
    return seen


def test_puts_wake_no_node_until_one_has_consumers_then_a_consumer_on_another_node(
    tmp_path: Path,
) -> None:
    with (
        RedisServer(tmp_path / "redis", aof=False) as server,
        BrokerProcess(["--store", server.url]) as a,
        BrokerProcess(["--store", server.url]) as b,
        Session(a.address, options=FAST) as producer,
        Session(b.address, options=FAST) as consumer,
    ):
        db = redis.Redis(host="127.0.0.1", port=server.port)
        pubsub = db.pubsub()  # type: ignore[no-untyped-call]
        pubsub.subscribe(WAKE)
        _wakes(pubsub)  # the subscribe confirmation
        queue = producer.open_queue(URI, write=True)
        for frame in range(5):  # a frame each: before, a wake each
            for i in range(60):
                queue.post(b"early %d.%d" % (frame, i))
            assert producer.flush(timeout=30)
        assert _wakes(pubsub) == []  # nobody consumes: no PUBLISH at all
        got = Collector()
        consumer.open_queue(URI, read=True, on_message=got)
        got.wait_for(300)
        wait_until(lambda: db.hlen(QueueKeys(URI).consumers) > 0, 10, "B's consumer count")
        _wakes(pubsub)
        late = queue.post(b"late")
        assert producer.flush(timeout=10)
        got.wait_for(301)
        assert got.guids()[-1] == late
        assert URI.encode() in _wakes(pubsub)  # node A woke node B's consumer
        pubsub.close()
        db.close()

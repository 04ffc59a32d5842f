"""A Redis that stalls (SIGSTOP) past ``--redis-retry`` while PUT scripts wait in its
sockets, then resumes and runs them. STORE_ERROR promises a PUT was not enqueued (the
client may post it again), so a PUT whose script reached Redis unanswered is never
ACKed STORE_ERROR: the node sends it again until Redis answers, and ACKs what the
GUID-deduplicated script says. Before, such PUTs were ACKed STORE_ERROR and then
delivered (found by an outside tester: 2-3 of 64)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from holdfast.broker.redis.keys import QueueKeys
from holdfast.sdk import AckStatus, Session
from tests.policies.support import Collector
from tests.redis.test_nodes import Acks
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

URI = "hf://stalled/orders"


def test_a_put_sent_to_a_stalled_redis_is_never_acked_store_error_and_then_delivered(
    tmp_path: Path,
) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url, "--redis-retry", "1"]) as broker,
        Session(broker.address, options=FAST) as session,
    ):
        acks = Acks()
        queue = session.open_queue(URI, write=True, on_ack=acks)
        warm = [queue.post(b"warm-%d" % i) for i in range(200)]
        assert session.flush(timeout=30)  # the node holds connected connections
        acks.exactly_one_success(warm)
        os.kill(redis.pid, signal.SIGSTOP)
        try:
            # The first frame goes out on an idle connection and waits in Redis's
            # socket; later ones may wait to connect (those are not sent at all).
            stalled = [queue.post(b"stalled-%d" % i) for i in range(20)]
            # The node's reply timeout (5 s) is past --redis-retry: the sent script
            # is now either ACKed (the defect: STORE_ERROR) or held.
            wait_until(
                lambda: "got no reply" in broker.output or stalled[0] in acks.statuses,
                30,
                "the first PUT's script to time out",
            )
        finally:
            os.kill(redis.pid, signal.SIGCONT)  # Redis runs what waits in its sockets
        assert session.flush(timeout=30)
        statuses = {g: acks.statuses[g] for g in stalled}
        assert all(len(s) == 1 for s in statuses.values()), statuses
        succeeded = {g for g, s in statuses.items() if s == [AckStatus.SUCCESS]}
        # Nothing but SUCCESS (held and resolved) or STORE_ERROR (never sent).
        assert {s[0] for s in statuses.values()} <= {AckStatus.SUCCESS, AckStatus.STORE_ERROR}
        got = Collector()
        session.open_queue(URI, read=True, on_message=got)
        body = QueueKeys(URI).body
        wait_until(
            lambda: (
                len(got.guids()) >= len(warm) + len(succeeded) and redis.cli("HLEN", body) == "0"
            ),
            30,
            "the queue drained",
        )
    delivered = got.guids()
    assert len(delivered) == len(set(delivered))
    assert set(delivered) - set(warm) == succeeded  # STORE_ERROR: never enqueued
    assert stalled[0] in succeeded  # the PUT that reached the stalled Redis


def test_a_put_redis_never_answers_within_the_dedup_window_is_acked_unknown(
    tmp_path: Path,
) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(
            ["--store", redis.url, "--redis-retry", "1", "--dedup-window", "2"]
        ) as broker,
        Session(broker.address, options=FAST) as session,
    ):
        acks = Acks()
        queue = session.open_queue(URI, write=True, on_ack=acks)
        queue.post(b"warm")
        assert session.flush(timeout=30)
        os.kill(redis.pid, signal.SIGSTOP)
        try:
            stalled = queue.post(b"stalled")
            # Still stalled when the PUT is as old as the window: it may or may not
            # be in the queue, and the ACK says so.
            wait_until(lambda: stalled in acks.statuses, 30, "the stalled PUT's ACK")
        finally:
            os.kill(redis.pid, signal.SIGCONT)
        assert "Redis never answered" in broker.output
    assert acks.statuses[stalled] == [AckStatus.UNKNOWN]

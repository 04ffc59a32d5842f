"""Queue policies on broker nodes sharing one Redis (issues #13 and #14): a policy set
through one node binds every node, counters and the admin service cover every node,
depth limits hold across nodes, and neither a dead-letter move nor a reject delay is
lost or doubled when the node doing it is killed; a delete waits for every node's
handles."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import Message, QueueOptions, Session
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import QueueInUseError, QueueNotFoundError
from tests.policies.support import (
    QUICK_RETRY,
    Collector,
    DeadLetterer,
    always_raises,
    drain,
    post_all,
    ready,
)
from tests.redis.test_nodes import Acks
from tests.support.metrics import metrics_address, scrape, value
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

URI = "hf://shared/orders"
DLQ = "hf://shared/orders.dlq"


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """Two broker nodes on one Redis of this test's (metrics on a free port each)."""
    with (
        RedisServer(tmp_path / "redis", aof=False) as redis,
        BrokerProcess(["--store", redis.url, "--metrics-port", "0"]) as a,
        BrokerProcess(["--store", redis.url, "--metrics-port", "0"]) as b,
    ):
        yield a, b


def test_a_policy_set_through_one_node_binds_the_others(
    nodes: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = nodes
    with (
        AdminClient(a.address) as admin_a,
        AdminClient(b.address) as admin_b,
    ):
        admin_a.set_policy(URI, QueuePolicy(max_deliveries=3, dead_letter=DLQ))
        seen: list[Message] = []
        dead = Collector()
        with Session(a.address, options=FAST) as on_a, Session(b.address, options=FAST) as on_b:
            (guid,) = post_all(on_a, URI, [b"poison"])
            on_b.open_queue(URI, read=True, on_message=always_raises(seen), options=QUICK_RETRY)
            on_a.open_queue(DLQ, read=True, on_message=dead)
            (letter,) = dead.wait_for(1)
        stats = admin_b.stats(URI)  # counted by node B, read through node A's Redis
        cli = subprocess.run(
            [sys.executable, "-m", "holdfast.admin", "--address", a.address, "policy", "show", URI],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert [m.delivery_count for m in seen] == [1, 2, 3]
    assert (letter.guid, letter.properties["x-death-reason"]) == (guid, "delivery-limit")
    assert (stats.ready, stats.unconfirmed, stats.rejected, stats.dead_lettered) == (0, 0, 3, 1)
    assert stats.accepted == 1
    assert cli.returncode == 0 and DLQ in cli.stdout


def test_a_depth_limit_holds_across_nodes(nodes: tuple[BrokerProcess, BrokerProcess]) -> None:
    a, b = nodes
    with AdminClient(b.address) as admin:
        admin.set_policy(URI, QueuePolicy(max_messages=50))
        acks = Acks()
        with Session(a.address, options=FAST) as on_a, Session(b.address, options=FAST) as on_b:
            guids = [on_a.open_queue(URI, write=True, on_ack=acks).post(b"a") for _ in range(40)]
            guids += [on_b.open_queue(URI, write=True, on_ack=acks).post(b"b") for _ in range(40)]
            wait_until(lambda: len(acks.statuses) == 50, 15, "50 ACKs")
            assert admin.stats(URI).ready == 50  # the other 30 are held by the SDKs
            got = Collector()
            on_b.open_queue(URI, read=True, on_message=got)
            assert on_a.flush(timeout=30) and on_b.flush(timeout=30)
            got.wait_for(80)
    acks.exactly_one_success(guids)
    assert Counter(got.guids()) == Counter({g: 1 for g in guids})


def test_a_node_killed_while_moving_dead_letters_loses_and_doubles_nothing(
    nodes: tuple[BrokerProcess, BrokerProcess],
) -> None:
    count = 3000
    a, b = nodes
    with AdminClient(b.address) as admin:
        admin.set_policy(URI, QueuePolicy(dead_letter=DLQ))
        reject = DeadLetterer(after=count // 3)  # then node A is killed
        with Session(b.address, options=FAST) as producer:
            guids = post_all(producer, URI, [b"m%d" % i for i in range(count)])
        victim = Session(a.address, options=FAST)
        victim.open_queue(
            URI, read=True, on_message=reject, options=QueueOptions(max_unconfirmed_messages=50)
        )
        assert reject.reached.wait(30)
        a.kill()  # SIGKILL while REJECTs and their moves are on their way
        victim.close(timeout=1)
        # Node B reclaims node A's deliveries within 4 s.
        try:
            wait_until(lambda: admin.stats(URI).ready + ready(admin, DLQ) == count, 15, "all back")
        except AssertionError:
            raise AssertionError((admin.stats(URI), admin.stats(DLQ))) from None
        collectors = drain(b.address, (URI, DLQ), count)
    assert 0 < len(collectors[DLQ].messages) < count
    seen = Counter(guid for c in collectors.values() for guid in c.guids())
    assert seen == Counter({guid: 1 for guid in guids})


def test_a_reject_delay_outlives_the_node_that_took_it(
    nodes: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = nodes
    with AdminClient(b.address) as admin:
        got = Collector(confirm=False)
        with Session(b.address, options=FAST) as producer:
            (guid,) = post_all(producer, URI, [b"later"])
        holder = Session(a.address, options=FAST)
        holder.open_queue(URI, read=True, on_message=got)
        got.wait_for(1)[0].reject(requeue=True, delay=2.0)
        wait_until(lambda: admin.stats(URI).unconfirmed == 0, 5, "the delay recorded")
        a.kill()
        holder.close(timeout=1)
        again = Collector()
        with Session(b.address, options=FAST) as survivor:
            survivor.open_queue(URI, read=True, on_message=again)
            (message,) = again.wait_for(1, timeout=10)
    assert (message.guid, message.delivery_count) == (guid, 2)


def test_every_node_reports_the_depth_kept_in_redis(
    nodes: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = nodes
    with (
        Session(a.address, options=FAST) as producer,
        Session(b.address, options=FAST) as reader,
    ):
        post_all(producer, URI, [b"x" * 10] * 7)
        producer.open_queue(URI, write=True)  # each node has the queue open; neither
        reader.open_queue(URI, write=True)  # consumes

        def depths() -> list[float | None]:
            return [
                value(scrape(metrics_address(node)), "holdfast_broker_queue_depth", queue=URI)
                for node in (a, b)
            ]

        wait_until(lambda: depths() == [7, 7], 10, "both nodes reporting 7 ready")
        size = value(scrape(metrics_address(b)), "holdfast_broker_queue_bytes", queue=URI)
    assert size == 70


def test_a_node_lets_go_of_queues_no_session_has_open(
    nodes: tuple[BrokerProcess, BrokerProcess],
) -> None:
    uris = [f"hf://shared/reply-{i}" for i in range(20)]
    node = nodes[0]
    with (
        AdminClient(node.address) as admin,
        Session(node.address, options=FAST) as session,
    ):
        for uri in uris:
            post_all(session, uri, [b"answer"])  # opens, posts, closes

        def served() -> set[str]:
            samples = scrape(metrics_address(node))
            return {dict(labels)["queue"] for name, labels in samples if "queue_depth" in name}

        wait_until(lambda: not served() & set(uris), 10, "the closed queues let go")
        assert [admin.stats(uri).ready for uri in uris] == [1] * len(uris)  # kept in Redis


def test_a_delete_through_one_node_is_refused_while_another_has_the_queue_open(
    nodes: tuple[BrokerProcess, BrokerProcess],
) -> None:
    a, b = nodes
    with AdminClient(a.address) as admin, Session(b.address, options=FAST) as session:
        post_all(session, URI, [b"m"])
        handle = session.open_queue(URI, write=True)
        wait_until(lambda: admin.stats(URI).handles == 1, 5, "node B's handle published")
        with pytest.raises(QueueInUseError, match="1 open handles"):
            admin.delete(URI)
        assert admin.stats(URI).ready == 1  # nothing happened
        handle.close()
        wait_until(lambda: admin.stats(URI).handles == 0, 5, "the handle gone")
        assert admin.delete(URI) == 1
        with pytest.raises(QueueNotFoundError):
            admin.stats(URI)

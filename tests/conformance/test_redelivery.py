"""Rule 9's redelivery, on every store, directly and through the proxy: what a
consumer held when its session went away goes to another consumer, with a delivery
count one higher; on Redis, what a broker node delivered comes back through another
node when that node is killed (``kill -9``) and its lease runs out."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from holdfast.sdk import AckStatus, QueueOptions, Session
from tests.conformance.conftest import PATHS, store_spec
from tests.conformance.harness import FAST, World, open_world
from tests.conformance.support import Inbox, peek, post_and_wait, wait_ready
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]

ONE = QueueOptions(max_unconfirmed_messages=1)


def test_a_closed_sessions_messages_go_to_the_waiting_consumer_counted(world: World) -> None:
    uri = world.uri("loss")
    with world.session() as producer:
        for payload in (b"first", b"second"):
            assert post_and_wait(producer, uri, payload) is AckStatus.SUCCESS
    with world.session() as survivor_session:
        with world.session() as doomed_session:
            doomed = Inbox()
            doomed_session.open_queue(uri, read=True, on_message=doomed, options=ONE)
            [held] = doomed.wait(1)
            survivor = Inbox(lambda m: m.confirm())
            survivor_session.open_queue(uri, read=True, on_message=survivor, options=ONE)
            # The other message is the survivor's; the held one stays held meanwhile.
            [other] = survivor.wait(1)
            assert other.payload != held.payload and other.delivery_count == 1
            wait_until(lambda: world.admin.stats(uri).unconfirmed == 1, 10, "one still held")
        # The doomed session closed without settling: its message is redelivered.
        again = survivor.wait(2)[1]
        assert (again.guid, again.payload) == (held.guid, held.payload)
        assert again.delivery_count == 2
        wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "all confirmed")
    assert peek(world, uri) == []


def test_a_consumer_that_returns_gets_its_messages_again_counted(world: World) -> None:
    uri = world.uri("return")
    with world.session() as producer:
        assert post_and_wait(producer, uri, b"again") is AckStatus.SUCCESS
    counts = []
    for _ in range(3):
        with world.session() as session:
            inbox = Inbox()
            session.open_queue(uri, read=True, on_message=inbox)
            counts.append(inbox.wait(1)[0].delivery_count)
        wait_ready(world, uri, 1)
    assert counts == [1, 2, 3]
    assert [m.delivery_count for m in peek(world, uri)] == [3]


@pytest.fixture(
    scope="module",
    params=[(s, p) for s in ("redis", "redis-cluster") for p in PATHS],
    ids=[f"{s}-{p}" for s in ("redis", "redis-cluster") for p in PATHS],
)
def redis_world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """A broker node on each Redis store (node loss is a rule of the nodes that share
    one Redis; the other stores have one broker), seen directly or through a proxy."""
    kind, path = request.param
    directory = tmp_path_factory.mktemp(f"{kind}-{path}-nodes")
    with open_world(kind, store_spec(kind, request, directory), path, directory) as world:
        yield world


@pytest.fixture
def doomed_node(redis_world: World) -> Iterator[tuple[BrokerProcess, str]]:
    """A second broker node on the world's Redis, with a short lease; its address as a
    client of this world's path reaches it (direct, or through a proxy of its own)."""
    spec = redis_world.broker.store
    with BrokerProcess(["--store", spec, "--redis-lease", "0.5"]) as node:
        if redis_world.path == "direct":
            yield node, node.address
        else:
            with ProxyProcess(["--upstream", node.address]) as proxy:
                yield node, proxy.address


def test_a_killed_nodes_deliveries_come_back_through_another_node(
    redis_world: World, doomed_node: tuple[BrokerProcess, str]
) -> None:
    world = redis_world
    node, address = doomed_node
    uri = world.uri("node")
    with world.session() as producer:
        for payload in (b"a", b"b", b"c"):
            assert post_and_wait(producer, uri, payload) is AckStatus.SUCCESS
    holder = Session(address, options=FAST)
    try:
        held = Inbox()
        holder.open_queue(uri, read=True, on_message=held)
        assert sorted(m.payload for m in held.wait(3)) == [b"a", b"b", b"c"]
        with world.session() as survivor_session:
            again = Inbox(lambda m: m.confirm())
            survivor_session.open_queue(uri, read=True, on_message=again)
            # While the node lives (its lease renewed), what it delivered stays its own:
            # several leases pass and the other node's consumer gets nothing.
            with pytest.raises(AssertionError, match="timed out"):
                wait_until(lambda: again.messages, 2.0, "a delivery of a live node's message")
            assert node.running
            node.kill()  # kill -9 holding three deliveries
            # Lease 0.5 s, grace and a reaping pass: well inside 15 s.
            redelivered = again.wait(3, timeout=15)
            wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "all confirmed")
    finally:
        holder.close(timeout=1)
    assert sorted(m.payload for m in redelivered) == [b"a", b"b", b"c"]
    assert {m.delivery_count for m in redelivered} == {2}
    assert len(redelivered) == 3
    assert peek(world, uri) == []

"""Redis nodes that a partition cannot fool (issue #32): fenced leases, liveness that
does not depend on load or link speed, a stalled node's deliveries revoked before any
peer reclaims them, and the deliveries of a node that rejoined reclaimed when it dies.

Each test starts its own redis-server and brokers; the link of node A to Redis goes
through a Toxiproxy link (``tests.toxiproxy_server``) that stalls or slows it."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from holdfast.sdk import DeliveriesRevoked, QueueOptions, Session
from tests.redis.fencing_kit import Deliveries, Events, redis_url_through
from tests.support.metrics import metrics_address, scrape, value
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.toxics import toxic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

URI = "hf://fence/orders"
LEASE = 1.5
"""The lease in these tests (``--redis-lease``): renewals every 0.5 s, reclaim no
sooner than 2 s after the last one."""


def post(address: str, count: int, tag: str) -> list[uuid.UUID]:
    """Post ``count`` messages to ``URI`` through ``address``; wait for their ACKs."""
    with Session(address, options=FAST) as producer:
        queue = producer.open_queue(URI, write=True)
        guids = [queue.post(f"{tag}-{i}".encode()) for i in range(count)]
        assert producer.flush(timeout=30)
    return guids


@contextlib.contextmanager
def stalled(link: Any) -> Iterator[None]:
    """A's link to Redis passes nothing either way (a partition) while inside."""
    with (
        toxic(link, "timeout", stream="downstream", timeout=0),
        toxic(link, "timeout", stream="upstream", timeout=0),
    ):
        yield


def hold(address: str, n: int) -> tuple[Session, Deliveries, Events]:
    """A session on ``address`` whose consumer holds up to ``n`` messages unconfirmed."""
    events = Events()
    held = Deliveries(hold=True)
    session = Session(address, options=FAST, on_event=events)
    session.open_queue(
        URI, read=True, on_message=held, options=QueueOptions(max_unconfirmed_messages=n)
    )
    return session, held, events


def test_a_stalled_node_revokes_before_its_peer_reclaims_then_rejoins_fenced(
    tmp_path: Path, toxic_link: Callable[[str, str], Any]
) -> None:
    lease = ["--redis-lease", str(LEASE)]
    with RedisServer(tmp_path / "redis") as redis:
        link = toxic_link("redis", redis.address)
        url_a = redis_url_through(link)
        with (
            BrokerProcess(["--store", url_a, *lease, "--metrics-port", "0"]) as a,
            BrokerProcess(["--store", redis.url, *lease, "--metrics-port", "0"]) as b,
        ):
            first = post(b.address, 100, "first")
            holder, held, events = hold(a.address, 50)
            wait_until(lambda: held.count() >= 50, 15, "50 deliveries held on A")
            on_a = set(held.guids())
            survivor = Deliveries()
            with stalled(link), Session(b.address, options=FAST) as taker:
                taker.open_queue(URI, read=True, on_message=survivor)
                # B delivers the other 50 at once, and A's 50 once it reclaimed them.
                wait_until(lambda: on_a <= set(survivor.guids()), 20, "A's deliveries on B")
            revoked = events.of(DeliveriesRevoked)
            assert [set(e.guids) for e, _ in revoked] == [on_a]  # type: ignore[attr-defined]
            revoked_at = revoked[0][1]
            seen_on_b = survivor.first_seen()
            assert revoked_at < min(seen_on_b[g] for g in on_a), "B delivered before A revoked"
            assert a.count("lease lapsed") >= 1
            # The link is back: A rejoins under a new fencing token, and what it delivers
            # under that one is reclaimed when it is killed.
            wait_until(lambda: a.count("redis lease taken") >= 2, 15, "A to rejoin")
            on_a_metrics = scrape(metrics_address(a))
            assert (value(on_a_metrics, "holdfast_broker_redis_lease_lapses_total") or 0) >= 1
            assert value(on_a_metrics, "holdfast_broker_redis_revoked_total") == 50
            reclaimed = value(scrape(metrics_address(b)), "holdfast_broker_redis_reclaimed_total")
            assert (reclaimed or 0) >= 50
            second = post(b.address, 40, "second")
            wait_until(lambda: set(second) <= set(held.guids()), 15, "A to deliver again")
            a.kill()
            holder.close(timeout=1)
            last = Deliveries()
            with Session(b.address, options=FAST) as taker:
                taker.open_queue(URI, read=True, on_message=last)
                wait_until(lambda: set(second) <= set(last.guids()), 15, "A's second deliveries")
        tokens = [line for line in a.output.splitlines() if "redis lease taken" in line]
        assert len({line.split("fencing token")[-1] for line in tokens}) == len(tokens)
        assert set(first) <= set(survivor.guids())


def test_confirms_not_recorded_before_the_lease_lapsed_are_revoked_too(
    tmp_path: Path, toxic_link: Callable[[str, str], Any]
) -> None:
    """A's consumer confirms 20 of its 50 as the link stalls: the CONFIRMs reach A but
    their write to Redis does not, so B will deliver those 20 again. A's consumer hears
    of all 50 in DeliveriesRevoked, not only of the 30 it still held."""
    lease = ["--redis-lease", str(LEASE)]
    with RedisServer(tmp_path / "redis") as redis:
        link = toxic_link("redis", redis.address)
        with (
            BrokerProcess(["--store", redis_url_through(link), *lease]) as a,
            BrokerProcess(["--store", redis.url, *lease]) as b,
        ):
            post(b.address, 50, "confirmed")
            holder, held, events = hold(a.address, 50)
            wait_until(lambda: held.count() >= 50, 15, "50 deliveries held on A")
            on_a = set(held.guids())
            survivor = Deliveries()
            with stalled(link), Session(b.address, options=FAST) as taker:
                for message in held.held[:20]:
                    message.confirm()  # taken by A; its Redis write stalls
                taker.open_queue(URI, read=True, on_message=survivor)
                wait_until(lambda: on_a <= set(survivor.guids()), 20, "A's deliveries on B")
            revoked: set[uuid.UUID] = set()
            for event, _ in events.of(DeliveriesRevoked):
                revoked |= set(event.guids)  # type: ignore[attr-defined]
            assert revoked == on_a
            holder.close(timeout=1)


def test_a_node_with_4000_open_queues_keeps_its_lease(tmp_path: Path) -> None:
    lease = ["--redis-lease", str(LEASE)]
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url, *lease]) as a,
        BrokerProcess(["--store", redis.url, *lease]) as b,
    ):
        post(b.address, 20, "held")
        holder, held, _ = hold(a.address, 20)
        wait_until(lambda: held.count() >= 20, 15, "20 deliveries held on A")
        openers = [Session(a.address, options=FAST) for _ in range(8)]
        try:
            for n, session in enumerate(openers):  # 500 each: under the per-session limits
                for i in range(500):
                    session.open_queue(f"hf://fence/q-{n}-{i}", write=True)
            other = Deliveries()
            with Session(b.address, options=FAST) as taker:
                taker.open_queue(URI, read=True, on_message=other)
                deadline = time.monotonic() + 4 * LEASE
                while time.monotonic() < deadline:
                    assert other.count() == 0, "A's held deliveries went to B"
                    time.sleep(0.05)
        finally:
            for session in openers:
                session.close(timeout=5)
            holder.close(timeout=1)
    assert a.count("lease lapsed") == 0
    assert b.count("is gone") == 0


def test_a_node_behind_a_slow_link_keeps_its_lease(
    tmp_path: Path, toxic_link: Callable[[str, str], Any]
) -> None:
    with RedisServer(tmp_path / "redis") as redis:
        link = toxic_link("redis", redis.address)
        url_a = redis_url_through(link)
        with (
            BrokerProcess(["--store", url_a]) as a,  # the default 3 s lease
            BrokerProcess(["--store", redis.url]) as b,
        ):
            post(b.address, 20, "held")
            holder, held, _ = hold(a.address, 20)
            wait_until(lambda: held.count() >= 20, 15, "20 deliveries held on A")
            other = Deliveries()
            with (
                toxic(link, "latency", stream="downstream", latency=150),
                toxic(link, "latency", stream="upstream", latency=150),
                Session(b.address, options=FAST) as taker,
            ):
                taker.open_queue(URI, read=True, on_message=other)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    assert other.count() == 0, "A's held deliveries went to B"
                    time.sleep(0.05)
            holder.close(timeout=1)
        assert a.count("lease lapsed") == 0
        assert b.count("is gone") == 0

"""Exactly once at the edges (issue 11): the four scenarios a hostile review used to
break dedup, on real processes with Toxiproxy links, each checked the same way as
every fault test (nothing lost that was ACKed SUCCESS, no copy twice, one ACK per PUT).

A consumer confirms while the producer posts, so a message's first copy is gone from
the queue when its replay arrives: only the GUID history (its window, its grace and
the PUT's age on the wire) can recognise the replay. PUTs the clients could no longer
vouch for end UNKNOWN, which the checks allow (it promises nothing).

1. the proxy killed with PUTs in flight on a slow upstream, which stays blocked past
   the broker's window: a restarted proxy must not restart the PUTs' age;
2. a broker that answers the proxy late: the proxy must not announce a window of its
   own to a client that then retransmits past the broker's;
3. a retransmit sent just inside the window and delayed in flight past it: the
   broker's grace covers the time in flight;
4. a GUID posted again after the window while its first copy is queued or
   unconfirmed: still a duplicate.

Each scenario runs in under ~20 s; ``make chaos``-style reruns loop over them.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from holdfast.sdk import AckStatus, QueueOptions, Session, StateRestored
from tests.faults.checks import (
    Producer,
    assert_exactly_once,
    copies_in_queue,
    drain,
    pause_until,
    wait_quiet,
)
from tests.faults.network import PROXY_ARGS, LinkFactory
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.recorder import AckRecorder, EventRecorder, MessageRecorder
from tests.support.sessions import FAST, unique_uri
from tests.support.toxics import down, link_address, toxic
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

GRACE_3 = os.environ.get("HOLDFAST_EDGES_GRACE", "1")
"""Scenario 3's broker grace (set to 0 to see the scenario break without one)."""

ALLOWED = (AckStatus.SUCCESS, AckStatus.UNKNOWN)
"""A PUT may end UNKNOWN when no hop can vouch for it any more; never twice in the queue."""


@dataclasses.dataclass
class Run:
    """A producer posting through ``entry`` while a consumer on the broker confirms."""

    broker: BrokerProcess
    uri: str
    session: Session
    producer: Producer
    acks: AckRecorder
    events: EventRecorder
    received: MessageRecorder


@pytest.fixture
def consumed() -> Any:
    """Start a run: ``consumed(broker, entry address, name, session options)``."""
    runs: list[tuple[Session, Session]] = []

    def start(
        broker: BrokerProcess, entry: str, name: str, options: Any = FAST, batch: int = 10
    ) -> Run:
        uri = unique_uri(name)
        received = MessageRecorder()
        consumer = Session(broker.address, options=FAST)
        consumer.open_queue(
            uri, read=True, on_message=received, options=QueueOptions(max_unconfirmed_messages=5000)
        )
        acks, events = AckRecorder(), EventRecorder()
        session = Session(entry, on_event=events, options=options)
        runs.append((session, consumer))
        queue = session.open_queue(uri, write=True, on_ack=acks)
        producer = Producer(queue, name, batch=batch).start()
        return Run(broker, uri, session, producer, acks, events, received)

    yield start
    for session, consumer in runs:
        session.close()
        consumer.close()


def wait_more_acks(run: Run, count: int = 300, timeout: float = 30.0) -> None:
    """Wait until ``count`` more ACKs arrived from now (the link carries PUTs again)."""
    target = len(run.acks) + count
    wait_until(lambda: len(run.acks) >= target, timeout, f"{count} more ACKs")


def finish(run: Run) -> None:
    """Stop posting, wait for every ACK, drain what the consumer has not had yet, and
    apply the three checks to everything the queue ever held."""
    posted = run.producer.stop()
    print(f"session events: {run.events.events}")
    assert run.session.flush(timeout=60), f"{run.session.pending_count} PUTs never ACKed"
    wait_quiet(lambda: len(run.received), quiet=1.0)
    with run.received.lock:
        copies = copies_in_queue(run.received.messages)
    copies += drain(run.broker.address, run.uri, 0)
    verdict = assert_exactly_once(posted, run.acks, copies, ALLOWED)
    print(verdict.summary())


@pytest.fixture
def proxied(broker_factory: Any, toxic_link: LinkFactory) -> Iterator[Any]:
    """``proxied(*broker_args) -> (broker, upstream link, proxy, client link)``."""
    proxies: list[ProxyProcess] = []

    def build(*broker_args: str) -> tuple[BrokerProcess, Any, ProxyProcess, Any]:
        broker = broker_factory(*broker_args)
        upstream = toxic_link("upstream", broker.address)
        proxy = ProxyProcess(["--upstream", link_address(upstream), *PROXY_ARGS]).start()
        proxies.append(proxy)
        client = toxic_link("client", proxy.address)
        return broker, upstream, proxy, client

    yield build
    for proxy in proxies:
        proxy.close()


def test_proxy_killed_with_a_slow_upstream_blocked_past_the_window(
    proxied: Any, consumed: Any
) -> None:
    """Scenario 1: kill -9 of the proxy, 0.6 s latency on its upstream, the upstream
    blocked until 8 s after the kill; the broker's window is 6 s (grace 1 s)."""
    broker, upstream, proxy, client = proxied("--dedup-window", "6", "--dedup-grace", "1")
    run = consumed(broker, link_address(client), "edge-proxy-kill")
    wait_until(lambda: len(run.acks) >= 300, 30, "300 ACKs")
    with toxic(upstream, "latency", stream="upstream", latency=600):
        wait_until(lambda: len(run.acks) >= 600, 30, "600 ACKs through the latency")
        killed = time.monotonic()
        proxy.kill()
        pause_until(killed + 1.0)
        with down(upstream):
            proxy.restart()
            pause_until(killed + 8.0)
        wait_more_acks(run)
    finish(run)


def test_broker_that_answers_the_proxy_late(proxied: Any, consumed: Any) -> None:
    """Scenario 2: the proxy restarts while its upstream is blocked for 7 s, past its
    5 s hello wait; the client (connect timeout 10 s) must learn the broker's 3 s
    window, not a default one, before it retransmits."""
    broker, upstream, proxy, client = proxied("--dedup-window", "3", "--dedup-grace", "0.5")
    options = dataclasses.replace(FAST, connect_timeout=10.0)
    run = consumed(broker, link_address(client), "edge-late-hello", options)
    wait_until(lambda: len(run.acks) >= 300, 30, "300 ACKs")
    # Latency on the upstream: PUTs the broker took are in flight back as ACKs when
    # the proxy dies, so the session has replays the broker already holds.
    with toxic(upstream, "latency", stream="downstream", latency=400):
        wait_more_acks(run)
        with down(upstream):
            stopped = time.monotonic()
            proxy.kill()
            proxy.restart()
            pause_until(stopped + 7.0)
    wait_more_acks(run)
    finish(run)


def test_retransmit_delayed_in_flight_past_the_window(
    broker_factory: Any, toxic_link: LinkFactory, consumed: Any
) -> None:
    """Scenario 3: ACKs black-holed for 1.2 s (the PUTs arrive at once, the ACKs never),
    then 0.9 s one-way latency while the session reconnects (its Hello and open take
    1.8 s) and retransmits: retransmits of PUTs posted around the blackout leave just
    inside the 3 s window (less the SDK's 10% margin) and reach the broker after it;
    the broker's 1 s grace covers them (with no grace they are enqueued twice)."""
    broker = broker_factory("--dedup-window", "3", "--dedup-grace", GRACE_3)
    link = toxic_link("entry", broker.address)
    # Pings must outlast the latency; the loss is caused by disabling the link.
    options = dataclasses.replace(FAST, keepalive_timeout=5.0, connect_timeout=5.0)
    # 200 PUTs a second: the PUTs of the blackout fit in HTTP/2's flow-control window
    # (no window update comes back through the black hole), so they all arrive.
    run = consumed(broker, link_address(link), "edge-in-flight", options, batch=2)
    wait_until(lambda: len(run.acks) >= 100, 30, "100 ACKs")
    with toxic(link, "timeout", stream="downstream", timeout=0):
        pause_until(time.monotonic() + 1.2)
        link.disable()  # the connection the session still believes in is gone
    with toxic(link, "latency", stream="upstream", latency=1100):
        link.enable()
        wait_until(lambda: run.events.of(StateRestored), 10, "the retransmits")
    wait_more_acks(run)
    finish(run)


@pytest.mark.parametrize("held", ["queued", "unconfirmed"])
@pytest.mark.parametrize("topology", ["direct", "proxy"])
def test_guid_posted_again_after_the_window_while_its_message_lives(
    broker_factory: Any, toxic_link: LinkFactory, proxied: Any, held: str, topology: str
) -> None:
    """Scenario 4: the same GUID posted again 1.5 s after a 0.5 s window (and grace)
    while its first copy is still in the queue or held unconfirmed by a consumer: both
    posts are ACKed SUCCESS and the queue holds it once."""
    args = ("--dedup-window", "0.5", "--dedup-grace", "0")
    if topology == "direct":
        broker = broker_factory(*args)
        entry = link_address(toxic_link("entry", broker.address))
    else:
        broker, _, _, client = proxied(*args)
        entry = link_address(client)
    uri = unique_uri(f"edge-live-{held}")
    guid = uuid.uuid4()
    acks = AckRecorder()
    holder = MessageRecorder(confirm=False)
    with Session(entry, options=FAST) as session, Session(broker.address, options=FAST) as other:
        queue = session.open_queue(uri, write=True, on_ack=acks)
        queue.post(b"only-once", guid=guid)
        assert session.flush(timeout=20)
        if held == "unconfirmed":
            other.open_queue(uri, read=True, on_message=holder)
            wait_until(lambda: len(holder) == 1, 10, "the first delivery")
        pause_until(time.monotonic() + 1.5)  # the history has forgotten the GUID
        queue.post(b"only-once", guid=guid)
        assert session.flush(timeout=20)
    # The holder's session closed without confirming: the message went back.
    copies = drain(broker.address, uri, 1)
    assert [(a.guid, a.status) for a, _ in acks.acks] == [(guid, AckStatus.SUCCESS)] * 2
    assert copies == [(guid, b"only-once")]

"""Chaos: a randomized, seeded schedule of every fault, over a large message count.

    SDK A ─link a─▶ holdfast-proxy ─link upstream─▶ broker (sqlite store)
    SDK C ─link c─▶ holdfast-proxy                     ▲
    SDK B ─link b──────────────────────────────────────┘

Producer A posts to queue A through the proxy, producer B to queue B directly, and a
third producer (session A) to queue C, which session C consumes and confirms while
the faults go on. The schedule draws, one after another, link outages, black holes,
``reset_peer``, latency spikes, bandwidth throttling and flapping on random links,
and SIGKILL + restart of the proxy or the broker; it is reproducible from its seed.
At the end everything heals, every PUT must be ACKed, and the queues are drained
from the broker and counted.

``make test`` runs a short schedule. ``make chaos`` runs the long one
(``HOLDFAST_CHAOS=1``; ``HOLDFAST_CHAOS_SECONDS`` and ``HOLDFAST_CHAOS_SEED`` change
its length and seed) and prints the lost / duplicated / ACK counts.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from holdfast.sdk import ConfirmRejected, HoldfastError, Message, Session
from tests.faults.checks import Producer, Verdict, drain, judge, pause_until
from tests.faults.network import LinkFactory, Network, network
from tests.faults.streams import flap
from tests.support.processes import BrokerProcess
from tests.support.recorder import AckRecorder, EventRecorder
from tests.support.sessions import FAST, unique_uri
from tests.support.toxics import add_toxic, link_address
from tests.support.waiting import wait_until

SEED = int(os.environ.get("HOLDFAST_CHAOS_SEED", "20251121"))
"""The schedule's seed (print it to replay a run)."""

LONG_SECONDS = float(os.environ.get("HOLDFAST_CHAOS_SECONDS", "120"))
"""Length of the long schedule."""

LINKS = ("a", "b", "c", "upstream")
"""Producer A's hop to the proxy, producer B's to the broker, the consumer's hop to
the proxy, and the proxy's hop to the broker."""

KINDS = (
    "down",
    "black_hole",
    "reset_peer",
    "latency",
    "bandwidth",
    "flap",
    "kill_proxy",
    "kill_broker",
)


@dataclass(frozen=True)
class Plan:
    """How long the schedule runs and how fast the producers post."""

    seconds: float
    batch: int
    """Messages each of producers A and B posts every 10 ms."""


SHORT = Plan(seconds=12.0, batch=5)
LONG = Plan(seconds=LONG_SECONDS, batch=10)


@dataclass(frozen=True)
class Fault:
    """One step of the schedule: ``kind`` on ``links`` (or a process) for ``hold`` s."""

    at: float
    kind: str
    links: tuple[str, ...]
    hold: float
    attributes: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        where = "+".join(self.links) or self.kind.removeprefix("kill_")
        extra = "".join(f" {k}={v}" for k, v in self.attributes.items())
        return f"{self.at:6.2f}s {self.kind:<11} {where:<12} {self.hold:.2f}s{extra}"


def schedule(seed: int, seconds: float) -> list[Fault]:
    """The faults of a run, drawn from ``seed``: one after another, 0.3-1.2 s apart,
    until ``seconds``."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = rng.uniform(0.5, 1.0)
    while at < seconds:
        kind = rng.choice(KINDS)
        links: tuple[str, ...] = ()
        attributes: dict[str, int] = {}
        hold = rng.uniform(0.3, 1.5)
        if kind == "flap":
            links = tuple(rng.sample(LINKS, rng.randint(1, 2)))
            hold = rng.uniform(1.0, 3.0)
        elif not kind.startswith("kill_"):
            links = (rng.choice(LINKS),)
        if kind == "black_hole":
            hold = rng.uniform(1.0, 3.0)  # long enough for keepalive to notice, or not
        elif kind == "reset_peer":
            attributes = {"timeout": rng.choice((0, 50, 200))}
        elif kind == "latency":
            attributes = {"latency": rng.choice((50, 200, 600, 1500)), "jitter": 20}
            hold = rng.uniform(1.0, 3.0)
        elif kind == "bandwidth":
            attributes = {"rate": rng.choice((8, 32, 128))}
            hold = rng.uniform(1.0, 2.5)
        faults.append(Fault(round(at, 2), kind, links, round(hold, 2), attributes))
        at += hold + rng.uniform(0.3, 1.2)
    return faults


class Consumer:
    """Records every delivery and confirms it; a CONFIRM the session drops (the link
    is down, or the delivery is stale) is counted: the broker redelivers it."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.dropped = 0
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.messages.append(message)
        try:
            message.confirm()
        except HoldfastError:
            with self.lock:
                self.dropped += 1

    def guids(self) -> set[uuid.UUID]:
        """Every GUID delivered at least once."""
        with self.lock:
            return {m.guid for m in self.messages}


@dataclass
class Chaos:
    """The running system and what the schedule does to it."""

    net: Network
    links: dict[str, Any]
    rng: random.Random

    def apply(self, fault: Fault) -> None:
        """Inflict ``fault`` for its hold time, then heal it."""
        proxy = self.net.proxy
        assert proxy is not None
        targets = [self.links[name] for name in fault.links]
        if fault.kind == "kill_proxy":
            proxy.kill()
            pause_until(time.monotonic() + fault.hold)
            proxy.restart()
        elif fault.kind == "kill_broker":
            self.net.broker.kill()
            pause_until(time.monotonic() + fault.hold)
            self.net.broker.restart()
        elif fault.kind == "flap":
            flap(targets, fault.hold, self.rng.randrange(2**32))
        else:
            with self.inflicted(fault, targets):
                pause_until(time.monotonic() + fault.hold)

    @contextlib.contextmanager
    def inflicted(self, fault: Fault, targets: list[Any]) -> Iterator[None]:
        """A network fault on ``targets`` during the block."""
        if fault.kind == "down":
            for link in targets:
                link.disable()
        elif fault.kind == "black_hole":
            for link in targets:
                for stream in ("upstream", "downstream"):
                    add_toxic(link, "timeout", stream, name=f"chaos_{stream}", timeout=0)
        else:
            stream = "upstream" if fault.kind in ("reset_peer", "bandwidth") else "downstream"
            for link in targets:
                add_toxic(link, fault.kind, stream, name="chaos", **fault.attributes)
        try:
            yield
        finally:
            self.heal(targets)

    def heal(self, targets: list[Any]) -> None:
        """Every toxic off ``targets`` and every one of them enabled."""
        for link in targets:
            for name in link.toxics():
                link.destroy_toxic(name)
            link.enable()

    def heal_all(self) -> None:
        """Everything healed and running, whatever step the schedule stopped at."""
        self.heal(list(self.links.values()))
        proxy = self.net.proxy
        if proxy is not None and not proxy.running:
            proxy.restart()
        if not self.net.broker.running:
            self.net.broker.restart()


def run_chaos(plan: Plan, seed: int, tmp_path: Path, new_link: LinkFactory) -> list[Verdict]:
    """Run producers and a consumer through ``schedule(seed, plan.seconds)``; return the
    verdicts on queues A and B (drained) and C (consumed)."""
    faults = schedule(seed, plan.seconds)
    kinds = Counter(f.kind for f in faults)
    print(
        f"\nchaos: seed {seed}, {len(faults)} faults in {plan.seconds:g} s "
        f"({', '.join(f'{k} x{n}' for k, n in sorted(kinds.items()))})"
    )
    for fault in faults:
        print(f"  {fault}")
    started = time.monotonic()
    broker = BrokerProcess(["--store", f"sqlite:{tmp_path / 'chaos.db'}", "--sync", "normal"])
    with broker, network("proxy", broker, new_link) as net:
        assert net.upstream is not None
        links = {
            "a": net.entry("a"),
            "b": new_link("b", broker.address),
            "c": net.entry("c"),
            "upstream": net.upstream,
        }
        chaos = Chaos(net, links, random.Random(seed))
        uri_a, uri_b, uri_c = unique_uri("chaos-a"), unique_uri("chaos-b"), unique_uri("chaos-c")
        acks = {name: AckRecorder() for name in ("a", "b", "c")}
        consumer = Consumer()
        events_c = EventRecorder()
        with (
            Session(link_address(links["a"]), options=FAST) as session_a,
            Session(link_address(links["b"]), options=FAST) as session_b,
            Session(link_address(links["c"]), on_event=events_c, options=FAST) as session_c,
        ):
            session_c.open_queue(uri_c, read=True, on_message=consumer)
            producers = {
                "a": Producer(session_a.open_queue(uri_a, write=True, on_ack=acks["a"]), "a"),
                "b": Producer(session_b.open_queue(uri_b, write=True, on_ack=acks["b"]), "b"),
                "c": Producer(session_a.open_queue(uri_c, write=True, on_ack=acks["c"]), "c"),
            }
            producers["a"].batch = producers["b"].batch = plan.batch
            producers["c"].batch = 1
            for producer in producers.values():
                producer.start()
            posted: dict[str, dict[uuid.UUID, bytes]] = {}
            try:
                for fault in faults:
                    pause_until(started + fault.at)
                    chaos.apply(fault)
            finally:
                chaos.heal_all()
                posted = {name: p.stop() for name, p in producers.items()}
            for session in (session_a, session_b):
                assert session.flush(timeout=120), f"{session.pending_count} PUTs never ACKed"
            wait_until(
                lambda: consumer.guids() >= set(posted["c"]), 120, "every message of queue C"
            )
        stored_a = drain(broker.address, uri_a, len(posted["a"]), timeout=120)
        stored_b = drain(broker.address, uri_b, len(posted["b"]), timeout=120)
        left_c = drain(broker.address, uri_c, 0)
    # Queue C was consumed: each GUID delivered counts once (a redelivery is no
    # duplicate), plus whatever was left. Its duplicates are not judged: a broker
    # killed before it stored a delivery count delivers with that count again.
    consumed = {m.guid: (m.guid, m.payload) for m in consumer.messages}
    verdicts = [
        judge(posted["a"], acks["a"], stored_a),
        judge(posted["b"], acks["b"], stored_b),
        judge(posted["c"], acks["c"], [*consumed.values(), *left_c]),
    ]
    redelivered = sum(1 for m in consumer.messages if m.delivery_count > 1)
    refused = sum(
        len(e.guids) for e in events_c.of(ConfirmRejected) if isinstance(e, ConfirmRejected)
    )
    print(f"chaos: done in {time.monotonic() - started:.1f} s")
    for name, verdict in zip(("A via proxy", "B direct", "C consumed"), verdicts, strict=True):
        print(f"  queue {name}: {verdict.summary()}")
    print(
        f"  queue C: {len(consumer.messages)} deliveries, {redelivered} redeliveries, "
        f"{consumer.dropped} confirms dropped by the session, {refused} refused by the proxy; "
        f"{sum(p.refused for p in producers.values())} posts refused by flow control"
    )
    return verdicts


@pytest.mark.timeout(240)
def test_a_short_randomized_fault_schedule(tmp_path: Path, toxic_link: LinkFactory) -> None:
    """The short schedule that ``make test`` runs."""
    verdicts = run_chaos(SHORT, SEED, tmp_path, toxic_link)
    for verdict in verdicts:
        assert verdict.ok, verdict.details()


@pytest.mark.chaos
@pytest.mark.timeout(int(LONG_SECONDS * 3) + 600)
def test_a_long_randomized_fault_schedule(tmp_path: Path, toxic_link: LinkFactory) -> None:
    """``make chaos``: the long schedule over a large message count."""
    verdicts = run_chaos(LONG, SEED, tmp_path, toxic_link)
    for verdict in verdicts:
        assert verdict.ok, verdict.details()

"""Building blocks of the fault scenarios: a producer stream through its own link,
and faults that act on several links at once."""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from holdfast.sdk import Queue, Session, SessionOptions
from tests.faults.checks import Producer, assert_exactly_once, drain, pause_until
from tests.faults.network import Network
from tests.support.recorder import AckRecorder, EventRecorder
from tests.support.sessions import FAST, unique_uri
from tests.support.toxics import link_address, toxic
from tests.support.waiting import wait_until


@dataclass
class Stream:
    """A producer session through its own link, posting while a test injects faults."""

    net: Network
    link: Any
    uri: str
    session: Session
    queue: Queue
    producer: Producer
    acks: AckRecorder = field(default_factory=AckRecorder)
    events: EventRecorder = field(default_factory=EventRecorder)
    posted: dict[uuid.UUID, bytes] = field(default_factory=dict)

    def wait_acked(self, count: int, timeout: float = 30.0) -> None:
        """Wait until ``count`` ACKs arrived in all."""
        wait_until(lambda: len(self.acks) >= count, timeout, f"{count} ACKs")

    def wait_more_posted(self, count: int) -> None:
        """Wait until ``count`` more PUTs were posted from now."""
        self.producer.wait_posted(self.producer.count + count)

    def losses(self) -> tuple[int, ...]:
        """Connection losses the session (and the proxy) saw so far."""
        return self.net.losses(self.events)

    def restores(self) -> tuple[int, ...]:
        """Restores the session (and the proxy) completed so far."""
        return self.net.restores(self.events)


@contextlib.contextmanager
def streaming(net: Network, name: str, options: SessionOptions = FAST) -> Iterator[Stream]:
    """A producer posting about 1000 messages a second through a link of its own. At the
    end of the block it stops, and every PUT must be ACKed within 60 s."""
    link = net.entry(name)
    acks, events = AckRecorder(), EventRecorder()
    uri = unique_uri(name)
    with Session(link_address(link), on_event=events, options=options) as session:
        queue = session.open_queue(uri, write=True, on_ack=acks)
        producer = Producer(queue, name).start()
        stream = Stream(net, link, uri, session, queue, producer, acks, events)
        try:
            yield stream
        finally:
            # Shown by pytest if the test fails: what the session went through.
            print(f"session events: {events.events}")
            print(f"posted {producer.count}, ACKs {len(acks)}")
            stream.posted = producer.stop()
        assert session.flush(timeout=60), f"{session.pending_count} PUTs never ACKed"


def check(stream: Stream) -> None:
    """The three checks, with the queue drained straight from the broker."""
    stored = drain(stream.net.broker.address, stream.uri, len(stream.posted))
    assert_exactly_once(stream.posted, stream.acks, stored)


@contextlib.contextmanager
def each(links: Sequence[Any], kind: str, **attributes: Any) -> Iterator[None]:
    """The same toxic on every link of ``links`` during the block."""
    with contextlib.ExitStack() as stack:
        for link in links:
            stack.enter_context(toxic(link, kind, **attributes))
        yield


@contextlib.contextmanager
def black_hole(links: Sequence[Any]) -> Iterator[None]:
    """Every byte in both directions dropped on ``links``, connections left open."""
    with (
        each(links, "timeout", stream="upstream", name="blackhole_up", timeout=0),
        each(links, "timeout", stream="downstream", name="blackhole_down", timeout=0),
    ):
        yield


def flap(links: Sequence[Any], duration: float, seed: int) -> None:
    """Take each link down for 100-300 ms and up for 200-500 ms, at random, for
    ``duration`` seconds; every link is up again at the end."""
    rng = random.Random(seed)
    schedule: list[tuple[float, int, bool]] = []
    for index in range(len(links)):
        at = rng.uniform(0.0, 0.5)
        while at < duration:
            schedule.append((at, index, False))
            at += rng.uniform(0.1, 0.3)
            schedule.append((at, index, True))
            at += rng.uniform(0.2, 0.5)
    start = time.monotonic()
    try:
        for at, index, enable in sorted(schedule):
            pause_until(start + at)
            if enable:
                links[index].enable()
            else:
                links[index].disable()
    finally:
        for link in links:
            link.enable()

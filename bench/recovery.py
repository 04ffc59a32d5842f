"""Recovery: a producer posting steadily while the upstream broker is cut for about 1 s.

Two kinds of cut, both on a broker with the sqlite store (``--sync full``):

* ``kill``: SIGKILL the broker, wait 1 s, start it again on the same port and file.
  The outage runs from the SIGKILL until the new broker logs ``listening on``
  (so it includes the broker's start and store recovery). The session (the SDK's
  direct, or the proxy's upstream) reconnects, reopens, retransmits, and reports
  ``StateRestored``: restore = that event's time - the broker's ``listening on``.
* ``stop``: SIGSTOP the broker for 1 s, then SIGCONT. The TCP connection survives
  and keepalive (1 s + 2 s) does not declare it dead, so nothing reconnects: the
  producer only waits.

The producer posts ``rate`` 100-byte messages per second from its own thread; its
stall is the longest gap between consecutive ACKs (``post()`` itself never blocks
while disconnected, rule 2; its longest call is reported too). The target is
stall <= outage + 0.3 s. Every PUT must be ACKed SUCCESS exactly once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import harness

from holdfast.sdk import Ack, AckStatus, Session, SessionEvent, StateRestored
from tests.support.processes import BrokerProcess, ProxyProcess

TICK = 0.005
"""Seconds between the producer's bursts (``rate * TICK`` messages each)."""


@dataclass
class RecoveryResult:
    """What one recovery run measured (seconds)."""

    path: str
    cut: str
    outage: float
    restore: float
    """Upstream back -> StateRestored (NaN when the link survived the cut)."""
    stall: float
    """Longest gap between consecutive ACKs."""
    stall_began: float
    """When that gap began, in seconds after the cut."""
    first_ack: float
    """Upstream back -> the first ACK after it (restore, then the retransmitted PUTs
    stored and ACKed)."""
    longest_post: float
    posted: int
    acked_ok: int
    duplicate_acks: int
    events: list[str] = field(default_factory=list)

    @property
    def budget(self) -> float:
        """The target for the stall: outage + 0.3 s."""
        return self.outage + 0.3


class SteadyProducer:
    """Posts ``rate`` messages per second on a thread of its own until stopped."""

    def __init__(self, session: Session, uri: str, rate: int) -> None:
        self.ack_times: list[float] = []
        self.acks: list[Ack] = []
        self.posted = 0
        self.longest_post = 0.0
        self._queue = session.open_queue(uri, write=True, on_ack=self._on_ack)
        self._burst = max(1, round(rate * TICK))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-producer", daemon=True)

    def _on_ack(self, ack: Ack) -> None:
        self.ack_times.append(time.perf_counter())
        self.acks.append(ack)

    def _run(self) -> None:
        payload = os.urandom(100)
        next_tick = time.perf_counter()
        while not self._stop.is_set():
            for _ in range(self._burst):
                started = time.perf_counter()
                self._queue.post(payload)
                self.longest_post = max(self.longest_post, time.perf_counter() - started)
                self.posted += 1
            next_tick += TICK
            delay = next_tick - time.perf_counter()
            if delay > 0:
                time.sleep(delay)

    def start(self) -> None:
        """Start posting."""
        self._thread.start()

    def stop(self) -> None:
        """Stop posting (what was posted is still ACKed)."""
        self._stop.set()
        self._thread.join(10)

    def longest_gap(self) -> tuple[float, float]:
        """The longest time between consecutive ACKs, and when it began."""
        times = sorted(self.ack_times)
        return max(((b - a, a) for a, b in itertools.pairwise(times)), default=(0.0, 0.0))


def _last_log_time(server: BrokerProcess | ProxyProcess, needle: str, after: float) -> float:
    """Wall time of the last log line of ``server`` containing ``needle``, written after
    ``after`` (NaN if there is none)."""
    found = float("nan")
    for line in server.output.splitlines():
        if needle in line:
            stamp = harness.log_time(line)
            if stamp is not None and stamp >= after:
                found = stamp
    return found


def _proxy_events(proxy: ProxyProcess, cut_at: float) -> list[str]:
    """The proxy's upstream ConnectionLost / Reconnected / StateRestored since the cut."""
    found = []
    for line in proxy.output.splitlines():
        for name in ("ConnectionLost", "Reconnected", "StateRestored"):
            stamp = harness.log_time(line)
            if f"{name}(" in line and stamp is not None and stamp >= cut_at:
                found.append(f"{stamp - cut_at:+.3f}s proxy {name}")
    return found


def run_recovery(
    directory: str,
    via_proxy: bool,
    cut: str,
    rate: int = 5000,
    before: float = 1.5,
    outage: float = 1.0,
    after: float = 2.0,
) -> RecoveryResult:
    """Run one recovery measurement (see the module docstring)."""
    store = harness.sqlite_store(directory)
    restored_at: list[float] = []
    events: list[str] = []
    cut_at = 0.0

    def on_event(event: SessionEvent) -> None:
        events.append(f"{time.time() - cut_at:+.3f}s {type(event).__name__}")
        if isinstance(event, StateRestored):
            restored_at.append(time.time())

    with contextlib.ExitStack() as servers:
        broker = servers.enter_context(harness.running_broker(store))
        proxy = servers.enter_context(harness.running_proxy(broker.address)) if via_proxy else None
        address = proxy.address if proxy is not None else broker.address
        with Session(address, on_event=on_event) as session:
            producer = SteadyProducer(session, f"hf://bench/recovery-{cut}", rate)
            producer.start()
            try:
                time.sleep(before)
                cut_at = time.time()
                cut_clock = time.perf_counter()
                if cut == "kill":
                    broker.kill()
                    time.sleep(outage)
                    broker.restart()
                    back_at = _last_log_time(broker, "listening on", cut_at)
                else:
                    os.kill(broker.pid, signal.SIGSTOP)
                    try:
                        time.sleep(outage)
                    finally:
                        os.kill(broker.pid, signal.SIGCONT)
                    back_at = time.time()
                time.sleep(after)
            finally:
                producer.stop()
            session.flush(30)
        if proxy is not None:
            events.extend(_proxy_events(proxy, cut_at))
            restored = _last_log_time(proxy, "StateRestored", cut_at)
        else:
            restored = restored_at[-1] if restored_at else float("nan")
    guids = [ack.guid for ack in producer.acks]
    stall, stall_began = producer.longest_gap()
    back_clock = cut_clock + (back_at - cut_at)
    first_ack = min((t for t in producer.ack_times if t > back_clock), default=float("nan"))
    return RecoveryResult(
        path="SDK->proxy->broker" if via_proxy else "SDK->broker",
        cut=cut,
        outage=back_at - cut_at,
        restore=restored - back_at,
        stall=stall,
        stall_began=stall_began - cut_clock,
        first_ack=first_ack - back_clock,
        longest_post=producer.longest_post,
        posted=producer.posted,
        acked_ok=sum(1 for ack in producer.acks if ack.status is AckStatus.SUCCESS),
        duplicate_acks=len(guids) - len(set(guids)),
        events=events,
    )

"""Holdfast through two crashes: nothing lost, nothing duplicated.

    python examples/outage_demo.py [--count 50000]

Starts a broker (durable sqlite store, in a temporary folder) and the local proxy
in front of it, then runs a producer and a consumer through the proxy. While the
producer is posting, the proxy is killed with SIGKILL and restarted, and later
the broker too. At the end it prints what was posted, ACKed and consumed, and
how many duplicates the queue held (there are none).

The producer never sees an error: PUTs are buffered by its session until they are
ACKed and retransmitted after each reconnect; the broker drops the replays by GUID.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from holdfast.sdk import (
    Ack,
    AckStatus,
    HoldfastError,
    Message,
    QueueOptions,
    ReconnectOptions,
    Session,
    SessionEvent,
    SessionOptions,
)
from holdfast.sdk.events import (
    ConnectAttemptFailed,
    ConnectionLost,
    QueueReopened,
    Reconnected,
    StateRestored,
)

QUEUE = "hf://demo/orders"
OPTIONS = SessionOptions(keepalive_time=0.5, keepalive_timeout=1.0, reconnect=ReconnectOptions())


class Server:
    """A ``holdfast-broker`` or ``holdfast-proxy`` subprocess on 127.0.0.1."""

    def __init__(self, module: str, *args: str) -> None:
        self.module = module
        self.args = args
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> Server:
        """Start it (on the port it had before, if any) and wait for ``listening on``."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "--listen", self.address, *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30
        for line in self.proc.stderr:
            match = re.search(r"listening on \S+:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                break
            if time.monotonic() > deadline:
                break
        else:
            raise RuntimeError(f"{self.module} exited before it listened")
        # Keep reading its log so the pipe never fills.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        return self

    def kill(self) -> None:
        """SIGKILL it, by PID, and wait until it is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM it and wait (SIGKILL if it does not go)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class Tally:
    """What the producer and consumer saw, counted from their callbacks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acks: Counter[AckStatus] = Counter()
        self.acked_guids: Counter[uuid.UUID] = Counter()
        self.consumed: Counter[uuid.UUID] = Counter()
        self.first_deliveries: Counter[uuid.UUID] = Counter()
        self.events: list[str] = []

    def on_ack(self, ack: Ack) -> None:
        with self.lock:
            self.acks[ack.status] += 1
            self.acked_guids[ack.guid] += 1

    def on_message(self, message: Message) -> None:
        with self.lock:
            self.consumed[message.guid] += 1
            # Two copies of a message in the queue would each be delivered a first time.
            self.first_deliveries[message.guid] += message.delivery_count == 1
        # If its link broke, the broker redelivers it, with a higher delivery_count.
        with contextlib.suppress(HoldfastError):
            message.confirm()

    def narrator(self, role: str) -> Callable[[SessionEvent], None]:
        """An ``on_event`` handler that tells the timeline, one line per event that
        matters (failed attempts are counted and told once per outage)."""
        retrying = [0]

        def on_event(event: SessionEvent) -> None:
            with self.lock:
                self.events.append(type(event).__name__)
            if isinstance(event, ConnectAttemptFailed):
                retrying[0] += 1
                if retrying[0] == 1:
                    say(
                        f"{role}: cannot reach {event.address} yet; retrying (posts keep buffering)"
                    )
                return
            line = _NARRATION.get(type(event))
            if line is not None:
                say(f"{role}: {line(event)}")
            if isinstance(event, Reconnected):
                retrying[0] = 0

        return on_event


_STARTED = time.monotonic()
_SAY = threading.Lock()

_NARRATION: dict[type[SessionEvent], Callable[[Any], str]] = {
    ConnectionLost: lambda e: f"connection lost ({e.reason.split(';')[0]})",
    Reconnected: lambda e: f"reconnected to {e.address}",
    QueueReopened: lambda e: f"queue {e.queue_uri} reopened",
    StateRestored: lambda e: f"state restored: {e.retransmitted} unACKed PUTs retransmitted",
}
"""The events the demo narrates, and how."""


def say(line: str) -> None:
    """One timeline line, with the seconds since the demo started."""
    with _SAY:
        print(f"{time.monotonic() - _STARTED:6.2f} s  {line}", flush=True)


def run(count: int) -> int:
    """Run the demo with ``count`` messages; return 0 if the queue held each exactly once."""
    with tempfile.TemporaryDirectory(prefix="holdfast-demo-") as folder:
        store = f"sqlite:{Path(folder) / 'broker.db'}"
        broker = Server("holdfast.broker", "--store", store).start()
        proxy = Server("holdfast.proxy", "--upstream", broker.address, "--keepalive", "0.5").start()
        say(f"broker on {broker.address} ({store}), proxy on {proxy.address}")
        tally = Tally()
        try:
            with (
                Session(
                    proxy.address, on_event=tally.narrator("consumer"), options=OPTIONS
                ) as consumer,
                Session(
                    proxy.address, on_event=tally.narrator("producer"), options=OPTIONS
                ) as producer,
            ):
                consumer.open_queue(
                    QUEUE,
                    read=True,
                    on_message=tally.on_message,
                    options=QueueOptions(max_unconfirmed_messages=2000),
                )
                queue = producer.open_queue(QUEUE, write=True, on_ack=tally.on_ack)
                posted: list[uuid.UUID] = []
                started = time.monotonic()
                for i in range(count):
                    posted.append(queue.post(b"order %08d" % i, properties={"seq": str(i)}))
                    if i == count // 4:
                        say(f"{i} posted: kill -9 the proxy")
                        proxy.kill()
                    elif i == count // 3:
                        say(f"{i} posted: restart the proxy")
                        proxy.start()
                    elif i == count // 2:
                        say(f"{i} posted: kill -9 the broker")
                        broker.kill()
                    elif i == 2 * count // 3:
                        say(f"{i} posted: restart the broker on the same file")
                        broker.start()
                say(f"all {count} posted in {time.monotonic() - started:.1f} s; waiting for ACKs")
                if not producer.flush(timeout=120):
                    print(f"{producer.pending_count} PUTs still unacknowledged after 120 s")
                deadline = time.monotonic() + 60
                say("every PUT answered; the consumer drains the queue")
                while len(tally.consumed) < count and time.monotonic() < deadline:
                    time.sleep(0.1)
                say(f"consumed {len(tally.consumed)} distinct messages")
        finally:
            proxy.stop()
            broker.stop()
    return report(tally, posted)


def report(tally: Tally, posted: list[uuid.UUID]) -> int:
    """Print the accounting; 0 if every message was ACKed once and consumed."""
    with tally.lock:
        acks_once = all(tally.acked_guids[g] == 1 for g in posted)
        missing = sum(1 for g in posted if g not in tally.consumed)
        redelivered = sum(n - 1 for n in tally.consumed.values())
        duplicates = sum(n - 1 for n in tally.first_deliveries.values() if n > 1)
        print()
        print(f"posted:      {len(posted)}")
        by_status = {status.value: n for status, n in tally.acks.items()}
        print(f"ACKed:       {sum(tally.acks.values())} {by_status}")
        print(f"one ACK per PUT: {'yes' if acks_once else 'NO'}")
        print(f"consumed:    {len(tally.consumed)} distinct, {missing} missing")
        print(f"duplicates in the queue (a GUID first-delivered twice): {duplicates}")
        print(f"redelivered: {redelivered} (at-least-once delivery after a consumer's link broke)")
        print(f"events:      {dict(Counter(tally.events))}")
    ok = (
        acks_once
        and missing == 0
        and duplicates == 0
        and tally.acks[AckStatus.SUCCESS] == len(posted)
    )
    print("RESULT:", "every message exactly once in the queue" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    return run(args.count)


if __name__ == "__main__":
    sys.exit(main())

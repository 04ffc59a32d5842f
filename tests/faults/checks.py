"""What every fault test checks, and the producer and queue readers it checks them with.

The three checks, the same for every fault:

- nothing lost: every PUT ACKed ``SUCCESS`` is in the queue;
- nothing duplicated in the queue: no GUID and no payload is held twice, and
  nothing is held that was not posted (the queue is drained and counted by GUID
  and by payload; every payload is unique to its PUT);
- exactly one ACK per PUT.

``Producer`` posts numbered, uniquely-paced messages from a thread of its own
while a test injects faults, recording each GUID with its payload.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from holdfast.sdk import AckStatus, FlowControlError, Queue, QueueOptions, Session
from tests.support.recorder import AckRecorder, MessageRecorder
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

Stored = tuple[uuid.UUID, bytes]
"""One copy of a message the queue held: its GUID and payload."""


class Producer:
    """Posts to ``queue`` from its own thread: ``batch`` messages every ``interval``
    seconds (about ``batch / interval`` per second), until stopped or ``limit`` posted.

    Payloads are ``<tag>-<index>`` padded to ``size`` bytes, so each is unique.
    """

    def __init__(
        self,
        queue: Queue,
        tag: str,
        *,
        batch: int = 10,
        interval: float = 0.01,
        size: int = 64,
        limit: int | None = None,
    ) -> None:
        self.queue = queue
        self.tag = tag.encode()
        self.batch = batch
        self.interval = interval
        self.size = size
        self.limit = limit
        self.posted: dict[uuid.UUID, bytes] = {}
        """Every PUT ``post()`` took, in post order: GUID to payload."""
        self.error: BaseException | None = None
        self.refused = 0
        """Posts refused by flow control (and retried)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producer-{tag}", daemon=True)

    def start(self) -> Producer:
        """Start posting; return ``self``."""
        self._thread.start()
        return self

    def _run(self) -> None:
        index = 0
        try:
            while not self._stop.is_set():
                for _ in range(self.batch):
                    if self.limit is not None and index >= self.limit:
                        return
                    payload = b"%s-%08d-" % (self.tag, index)
                    payload += b"." * max(0, self.size - len(payload))
                    try:
                        guid = self.queue.post(payload)
                    except FlowControlError:
                        # Not taken (the high watermark held for 5 s): the same
                        # message is posted again, as an application would.
                        self.refused += 1
                        break
                    with self._lock:
                        self.posted[guid] = payload
                    index += 1
                # The pace of the stream (not a wait for a condition); stop() cuts it short.
                self._stop.wait(self.interval)
        except BaseException as error:  # reported by stop()
            self.error = error

    @property
    def count(self) -> int:
        """How many PUTs were posted so far."""
        with self._lock:
            return len(self.posted)

    def wait_posted(self, count: int, timeout: float = 30.0) -> None:
        """Wait until at least ``count`` PUTs were posted in all."""
        wait_until(lambda: self.count >= count or self.error is not None, timeout, f"{count} posts")
        if self.error is not None:
            raise AssertionError(f"the producer failed: {self.error!r}") from self.error

    def stop(self, timeout: float = 30.0) -> dict[uuid.UUID, bytes]:
        """Stop posting; return what was posted. Re-raises a failure of the thread."""
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the producer did not stop"
        if self.error is not None:
            raise AssertionError(f"the producer failed: {self.error!r}") from self.error
        with self._lock:
            return dict(self.posted)


def wait_quiet(count: Callable[[], int], quiet: float = 0.5, timeout: float = 30.0) -> None:
    """Wait until ``count()`` has not changed for ``quiet`` seconds (a bounded wait for
    anything still on its way, such as a duplicate right behind the rest)."""
    deadline = time.monotonic() + timeout
    last, since = count(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() >= deadline:
            raise AssertionError(f"still receiving after {timeout} s")
        time.sleep(0.02)
        if (now := count()) != last:
            last, since = now, time.monotonic()


def pause_until(deadline: float) -> None:
    """Wait until the monotonic clock reaches ``deadline``: the next step of a fault
    schedule, which is a point in time rather than a condition."""
    remaining = deadline - time.monotonic()
    if remaining > 0:
        threading.Event().wait(remaining)


def drain(address: str, uri: str, expected: int, timeout: float = 60.0) -> list[Stored]:
    """Consume and confirm ``uri`` until ``expected`` messages arrived and no more come
    for half a second; return every copy received."""
    received = MessageRecorder()
    with Session(address, options=FAST) as session:
        session.open_queue(
            uri,
            read=True,
            on_message=received,
            options=QueueOptions(max_unconfirmed_messages=5000),
        )
        wait_until(lambda: len(received) >= expected, timeout, f"{expected} messages")
        wait_quiet(lambda: len(received))
    with received.lock:
        return [(m.guid, m.payload) for m in received.messages]


class Delivered(Protocol):
    """What ``copies_in_queue`` reads of a delivered ``Message``."""

    @property
    def guid(self) -> uuid.UUID: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def delivery_count(self) -> int: ...


def copies_in_queue(deliveries: Iterable[Delivered]) -> list[Stored]:
    """The copies the queue held, judged from what a consumer received.

    A redelivery carries a higher ``delivery_count``; a second copy of a message in the
    queue would be delivered with a count already seen. So each GUID stands for as
    many copies as the largest number of deliveries sharing one count.
    """
    by_guid: dict[uuid.UUID, Counter[int]] = defaultdict(Counter)
    payloads: dict[uuid.UUID, bytes] = {}
    for message in deliveries:
        by_guid[message.guid][message.delivery_count] += 1
        payloads.setdefault(message.guid, message.payload)
    return [
        (guid, payloads[guid])
        for guid, counts in by_guid.items()
        for _ in range(max(counts.values()))
    ]


@dataclass
class Verdict:
    """What a fault did to the messages, by the three checks."""

    posted: int
    lost: set[uuid.UUID] = field(default_factory=set)
    """ACKed SUCCESS, not in the queue."""
    duplicated: dict[object, int] = field(default_factory=dict)
    """GUIDs and payloads the queue held more than once, with their counts."""
    unexpected: set[object] = field(default_factory=set)
    """GUIDs and payloads in the queue that were never posted (or not with that payload)."""
    ack_counts: dict[uuid.UUID, int] = field(default_factory=dict)
    """PUTs ACKed other than exactly once, with the number of ACKs."""
    statuses: Counter[str] = field(default_factory=Counter)
    """How many PUTs ended with each status."""
    refused: dict[uuid.UUID, str] = field(default_factory=dict)
    """PUTs that ended with a status the test did not allow."""

    @property
    def ok(self) -> bool:
        """True when nothing was lost, duplicated or ACKed other than once."""
        return not (
            self.lost or self.duplicated or self.unexpected or self.ack_counts or self.refused
        )

    def summary(self) -> str:
        """One line: the counts a chaos run prints."""
        statuses = ", ".join(f"{name} {n}" for name, n in sorted(self.statuses.items()))
        return (
            f"posted {self.posted}: lost {len(self.lost)}, duplicated {len(self.duplicated)}, "
            f"unexpected {len(self.unexpected)}, PUTs not ACKed exactly once "
            f"{len(self.ack_counts)} (ACKs: {statuses})"
        )

    def details(self, limit: int = 5) -> str:
        """The summary and a few examples of each failure."""
        parts = [self.summary()]
        for name in ("lost", "duplicated", "unexpected", "ack_counts", "refused"):
            value = getattr(self, name)
            if value:
                items = list(value.items() if isinstance(value, dict) else value)
                parts.append(f"{name}: {items[:limit]}")
        return "\n".join(parts)


def judge(
    posted: Mapping[uuid.UUID, bytes],
    acks: AckRecorder,
    stored: Iterable[Stored],
    allowed: Iterable[AckStatus] = (AckStatus.SUCCESS,),
) -> Verdict:
    """Apply the three checks to what was posted, the ACKs and the queue's copies.

    ``allowed`` are the statuses a PUT may end with (``UNKNOWN`` too where the test
    closes a queue during an outage); only ``SUCCESS`` promises the message is there.
    """
    allowed = set(allowed)
    verdict = Verdict(posted=len(posted))
    with acks.lock:
        reported = [(ack.guid, ack.status) for ack, _ in acks.acks]
    per_guid = Counter(guid for guid, _ in reported)
    status = {guid: s for guid, s in reported}
    verdict.ack_counts = {g: per_guid[g] for g in posted if per_guid[g] != 1}
    verdict.ack_counts.update({g: n for g, n in per_guid.items() if g not in posted})
    verdict.statuses = Counter(status[g].value for g in posted if g in status)
    verdict.refused = {
        g: status[g].value for g in posted if g in status and status[g] not in allowed
    }

    copies = list(stored)
    by_guid = Counter(guid for guid, _ in copies)
    by_payload = Counter(payload for _, payload in copies)
    verdict.duplicated = {k: n for k, n in (*by_guid.items(), *by_payload.items()) if n > 1}
    payloads = set(posted.values())
    verdict.unexpected = {g for g in by_guid if g not in posted}
    verdict.unexpected |= {p for p in by_payload if p not in payloads}
    verdict.unexpected |= {g for g, p in copies if g in posted and posted[g] != p}
    verdict.lost = {g for g in posted if status.get(g) is AckStatus.SUCCESS and g not in by_guid}
    return verdict


def assert_exactly_once(
    posted: Mapping[uuid.UUID, bytes],
    acks: AckRecorder,
    stored: Iterable[Stored],
    allowed: Iterable[AckStatus] = (AckStatus.SUCCESS,),
) -> Verdict:
    """``judge`` and fail the test with the details unless the verdict is clean."""
    assert posted, "nothing was posted: the test did not exercise anything"
    verdict = judge(posted, acks, stored, allowed)
    assert verdict.ok, verdict.details()
    return verdict

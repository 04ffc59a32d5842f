"""The broker on ``--store sqlite:PATH``, as a process: what survives SIGTERM and
SIGKILL, what a broker says about a store it cannot use, and the SDK through a kill -9.

Every assertion about the queue drains it and counts: nothing lost, nothing twice.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from holdfast.proto import pb
from holdfast.sdk import (
    AckStatus,
    ConnectionLost,
    Reconnected,
    Session,
    SessionEvent,
)
from tests.broker.util import connected, new_guid, options, statuses, unique_uri
from tests.support.columns import PushView, pushes_of
from tests.support.processes import BrokerProcess
from tests.support.recorder import AckRecorder, EventRecorder
from tests.support.sessions import FAST, drain_messages
from tests.support.waiting import wait_until
from tests.support.wire_client import PutItem, WireClient


def sqlite_broker(path: Path, *args: str) -> BrokerProcess:
    """A broker (not started) on the sqlite store at ``path``."""
    return BrokerProcess(["--store", f"sqlite:{path}", *args])


def frames(items: Sequence[PutItem], size: int) -> Iterator[Sequence[PutItem]]:
    """``items`` cut into PutBatch frames of ``size`` PUTs."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def put_all(client: WireClient, queue_id: int, items: Sequence[PutItem], size: int = 100) -> None:
    for frame in frames(items, size):
        client.put(queue_id, frame)


def drain_wire(
    client: WireClient, queue_id: int, uri: str, expected: int, timeout: float = 30.0
) -> list[PushView]:
    """Open ``uri`` for reading as ``queue_id``, take ``expected`` PUSHes, confirm them,
    and check that nothing more arrives for a moment (a duplicate would)."""
    assert client.open(queue_id, uri, read=True, options=options(messages=100_000)).status == (
        pb.STATUS_OK
    )
    pushes = client.pushes(expected, timeout) if expected else []
    client.confirm(queue_id, [push.guid for push in pushes])
    extra = [push for frame in client.quiet("pushes", 0.5) for push in pushes_of(frame.pushes)]
    return pushes + extra


def items_of(count: int, tag: str) -> list[PutItem]:
    return [(new_guid(), f"{tag}-{i}".encode(), {"i": str(i), "tag": tag}) for i in range(count)]


# -- the GUID history across restarts ---------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_replays_after_a_restart_are_acked_ok_and_not_enqueued_again(
    tmp_path: Path, stop: str
) -> None:
    uri = unique_uri("sqlite-dedup")
    sent = items_of(300, "first")
    with sqlite_broker(tmp_path / "broker.db") as broker:
        with connected(broker.address) as client:
            assert client.open(1, uri, write=True).status == pb.STATUS_OK
            put_all(client, 1, sent)
            acks = client.acks(len(sent))
            assert statuses(acks) == ["STATUS_OK"] * len(sent)
        if stop == "sigkill":
            broker.kill()
        else:
            assert broker.terminate() == 0
        broker.restart()
        assert "recovered 300 messages and 300 GUIDs" in broker.output

        fresh = items_of(20, "fresh")
        replayed = [*sent[:150], *fresh, *sent[150:]]
        with connected(broker.address) as client:
            assert client.open(1, uri, write=True).status == pb.STATUS_OK
            put_all(client, 1, replayed, size=64)
            acks = client.acks(len(replayed))
            assert [ack.guid for ack in acks] == [guid for guid, _, _ in replayed]
            assert statuses(acks) == ["STATUS_OK"] * len(replayed)
            pushes = drain_wire(client, 2, uri, len(sent) + len(fresh))

    expected = {guid: (payload, properties) for guid, payload, properties in [*sent, *fresh]}
    assert Counter(push.guid for push in pushes) == Counter(expected.keys())
    assert {push.guid: (push.payload, dict(push.properties)) for push in pushes} == expected
    # Recovered in acceptance order, then the fresh ones.
    assert [push.guid for push in pushes] == list(expected.keys())
    assert {push.delivery_count for push in pushes} == {1}


@pytest.mark.timeout(60)
def test_messages_acked_before_a_sigkill_are_delivered_after_the_restart(tmp_path: Path) -> None:
    uri = unique_uri("sqlite-kill")
    sent = items_of(5000, "m")
    with sqlite_broker(tmp_path / "broker.db") as broker:
        with connected(broker.address) as client:
            assert client.open(1, uri, write=True).status == pb.STATUS_OK
            put_all(client, 1, sent, size=50)
            # Killed with the rest of the PUTs still in flight.
            acked = client.acks(1000)
            broker.kill()
        assert statuses(acked) == ["STATUS_OK"] * len(acked)
        broker.restart()
        with connected(broker.address) as client:
            recovered = recovered_count(broker.output)
            pushes = drain_wire(client, 1, uri, recovered)

    counts = Counter(push.guid for push in pushes)
    assert max(counts.values()) == 1, "a message was stored twice"
    assert {ack.guid for ack in acked} <= set(counts), "an ACKed message was lost"
    assert set(counts) <= {guid for guid, _, _ in sent}
    payloads = {guid: payload for guid, payload, _ in sent}
    assert all(push.payload == payloads[push.guid] for push in pushes)


@pytest.mark.timeout(60)
def test_confirmations_and_delivery_counts_survive_a_graceful_restart(tmp_path: Path) -> None:
    uri = unique_uri("sqlite-confirm")
    sent = items_of(10, "m")
    with sqlite_broker(tmp_path / "broker.db") as broker:
        with connected(broker.address) as client:
            assert client.open(1, uri, write=True, read=True).status == pb.STATUS_OK
            put_all(client, 1, sent)
            assert statuses(client.acks(10)) == ["STATUS_OK"] * 10
            pushes = client.pushes(10)
            assert [push.delivery_count for push in pushes] == [1] * 10
            client.confirm(1, [push.guid for push in pushes[:4]])
            client.barrier()
        # The session ends with six messages unconfirmed: they go back to the queue.
        assert broker.terminate() == 0
        broker.restart()
        with connected(broker.address) as client:
            # The confirmed four are gone from the queue but not from the GUID history:
            # replaying all ten enqueues nothing.
            assert client.open(2, uri, write=True).status == pb.STATUS_OK
            put_all(client, 2, sent)
            assert statuses(client.acks(10)) == ["STATUS_OK"] * 10
            again = drain_wire(client, 1, uri, 6)
    assert [push.guid for push in again] == [guid for guid, _, _ in sent[4:]]
    assert [push.delivery_count for push in again] == [2] * 6


# -- stores a broker cannot use ---------------------------------------------------------


def run_broker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "holdfast.broker", "--listen", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def random_bytes(tmp_path: Path) -> Path:
    path = tmp_path / "random.db"
    path.write_bytes(os.urandom(16384))
    return path


def directory(tmp_path: Path) -> Path:
    return tmp_path


def missing_directory(tmp_path: Path) -> Path:
    return tmp_path / "missing" / "broker.db"


def unwritable(tmp_path: Path) -> Path:
    return Path("/proc/holdfast-broker.db")


def other_database(tmp_path: Path) -> Path:
    path = tmp_path / "other.db"
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sqlite3; sqlite3.connect({str(path)!r}).execute('CREATE TABLE t (x)')",
        ],
        check=True,
        timeout=30,
    )
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (random_bytes, "file is not a database"),
        (directory, "it is a directory"),
        (missing_directory, "does not exist"),
        pytest.param(
            unwritable,
            "unable to open",
            marks=pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc"),
        ),
        (other_database, "not a Holdfast store"),
    ],
)
def test_a_store_the_broker_cannot_use_is_one_clear_line_and_exit_2(
    tmp_path: Path, make: Callable[[Path], Path], problem: str
) -> None:
    path = make(tmp_path)
    result = run_broker("--store", f"sqlite:{path}")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0]
    assert problem in lines[0]
    assert "ERROR" in lines[0]
    assert "Traceback" not in result.stderr
    assert "listening on" not in result.stderr


@pytest.mark.timeout(60)
def test_a_store_damaged_inside_fails_the_start_with_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    uri = unique_uri("sqlite-damaged")
    with sqlite_broker(path) as broker, connected(broker.address) as client:
        assert client.open(1, uri, write=True).status == pb.STATUS_OK
        put_all(client, 1, [(new_guid(), os.urandom(300), {}) for _ in range(2000)])
        assert statuses(client.acks(2000)) == ["STATUS_OK"] * 2000
    page = 4096
    assert path.stat().st_size > 20 * page
    # Pages of the messages table, past the schema on page 1.
    with path.open("r+b") as file:
        file.seek(5 * page)
        file.write(os.urandom(3 * page))
    result = run_broker("--store", f"sqlite:{path}")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0]
    assert "malformed" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(60)
def test_a_second_broker_on_the_same_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    with sqlite_broker(path):
        result = run_broker("--store", f"sqlite:{path}")
    assert result.returncode == 2, result.stderr
    assert "in use by another process" in result.stderr
    assert "Traceback" not in result.stderr


def recovered_count(output: str) -> int:
    """How many messages the broker said it recovered at start."""
    match = re.search(r"recovered (\d+) messages", output)
    assert match is not None, "the broker did not log what it recovered"
    return int(match[1])


# -- the SDK through a kill -9 ----------------------------------------------------------


def tagging(acks: AckRecorder, events: EventRecorder) -> Callable[[SessionEvent], None]:
    """Record events, and count reconnections in ``acks.epoch`` (events and ACK callbacks
    run in order on one SDK thread)."""

    def handler(event: SessionEvent) -> None:
        events(event)
        if isinstance(event, Reconnected):
            with acks.lock:
                acks.epoch += 1

    return handler


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sdk_stream_of_50k_puts_through_a_broker_kill_9_exactly_once(tmp_path: Path) -> None:
    """Acceptance: SIGKILL the broker in the middle of 50k PUTs, restart it on the same
    file and port. Every PUT gets exactly one ACK, SUCCESS, and the queue holds every
    posted message exactly once: what the killed broker committed is recovered, what
    the SDK retransmits of it is recognised by the recovered GUID history."""
    total = 50_000
    kill_at = 20_000  # posted
    restart_at = 30_000
    uri = unique_uri("sqlite-kill-9")
    acks, events = AckRecorder(), EventRecorder()
    posted: list[uuid.UUID] = []
    started = time.monotonic()
    with sqlite_broker(tmp_path / "broker.db") as broker:
        with Session(broker.address, on_event=tagging(acks, events), options=FAST) as session:
            queue = session.open_queue(uri, write=True, on_ack=acks)
            acked_at_kill = 0
            for i in range(total):
                posted.append(queue.post(b"%06d" % i, properties={"n": str(i)}))
                if i == kill_at:
                    # Some ACKed, the rest in flight: committed or not, ACKed or not.
                    wait_until(lambda: len(acks) >= 5_000, 60, "5000 ACKs before the kill")
                    acked_at_kill = len(acks)
                    broker.kill()
                elif i == restart_at:
                    broker.restart()
            assert session.flush(timeout=180), f"{total - len(acks)} PUTs never ACKed"
        recovered = recovered_count(broker.output)
        received = drain_messages(broker.address, uri, total, timeout=120)
    elapsed = time.monotonic() - started
    print(
        f"\n50k PUTs through a broker kill -9 (sqlite, sync full): {elapsed:.1f} s; "
        f"{acked_at_kill} ACKed before the kill, {recovered} recovered"
    )

    assert 0 < acked_at_kill < total
    assert recovered >= acked_at_kill, "the restarted broker lost ACKed messages"
    assert len(set(posted)) == total
    assert acks.per_guid() == Counter({guid: 1 for guid in posted})
    assert acks.with_status(AckStatus.SUCCESS) == set(posted)
    assert events.of(ConnectionLost), "the kill went unnoticed"
    assert any(epoch >= 1 for _, epoch in acks.acks), "nothing was ACKed after the restart"
    assert Counter(m.guid for m in received) == Counter({guid: 1 for guid in posted})
    expected = {guid: b"%06d" % i for i, guid in enumerate(posted)}
    assert Counter(m.payload for m in received) == Counter(expected.values())
    assert all(m.payload == expected[m.guid] for m in received)
    assert all(dict(m.properties) == {"n": str(int(m.payload))} for m in received)


# -- throughput (printed, not asserted) -------------------------------------------------


def put_ack_rate(broker: BrokerProcess, count: int, frame: int) -> float:
    """PUTs per second from the first frame sent to the last ACK, pipelined frames."""
    items: list[PutItem] = [(new_guid(), b"x" * 100, {}) for _ in range(count)]
    uri = unique_uri("throughput")
    with connected(broker.address) as client:
        assert client.open(1, uri, write=True).status == pb.STATUS_OK
        start = time.perf_counter()
        put_all(client, 1, items, size=frame)
        acks = client.acks(count, timeout=120)
        elapsed = time.perf_counter() - start
    assert statuses(acks) == ["STATUS_OK"] * count
    return count / elapsed


@pytest.mark.timeout(240)
def test_put_ack_throughput_memory_vs_sqlite(tmp_path: Path) -> None:
    count = 20_000
    rates: dict[str, float] = {}
    stores: Iterable[tuple[str, list[str]]] = [
        ("memory", ["--store", "memory"]),
        ("sqlite full", ["--store", f"sqlite:{tmp_path / 'full.db'}", "--sync", "full"]),
        ("sqlite normal", ["--store", f"sqlite:{tmp_path / 'normal.db'}", "--sync", "normal"]),
    ]
    for name, args in stores:
        with BrokerProcess(args) as broker:
            put_ack_rate(broker, 2000, 100)  # warm up
            rates[name] = put_ack_rate(broker, count, 100)
    print()
    for name, rate in rates.items():
        print(f"PUT->ACK {name:>13}: {rate:9,.0f} msg/s ({count} PUTs, 100 per frame)")

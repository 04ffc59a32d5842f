"""Streaming through ``format("holdfast")`` with the driver SIGKILLed and restarted:
the writer past the broker's dedup window, and the exactly-once source."""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from holdfast.sdk import Session
from tests.spark.drivers import DriverProcess
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, drain_messages, unique_uri

WINDOW = 2.0
"""The broker's dedup window in these tests (seconds)."""


def post_more(broker: BrokerProcess, uri: str, posted: list[uuid.UUID], count: int) -> None:
    """Post ``count`` more messages to ``uri`` (payloads numbered on from ``posted``),
    wait for their ACKs and add their GUIDs to ``posted``."""
    with Session(broker.address, options=FAST) as session:
        queue = session.open_queue(uri, write=True)
        base = len(posted)
        posted.extend([queue.post(f"m{base + i}".encode()) for i in range(count)])
        assert session.flush(30)


def read_output(out: Path) -> Counter[uuid.UUID]:
    """How often each GUID is in the read-stream driver's output files."""
    return Counter(
        uuid.UUID(line) for p in out.glob("batch-*.txt") for line in p.read_text().split()
    )


def add_batch(source: Path, batch: int, rows: int = 100) -> None:
    lines = (json.dumps({"order_id": batch * rows + i, "item": f"i{i}"}) for i in range(rows))
    temporary = source / f".part-{batch}.tmp"
    temporary.write_text("\n".join(lines) + "\n")
    temporary.rename(source / f"part-{batch}.json")


@pytest.mark.timeout(240)
def test_stream_write_replayed_after_a_driver_kill_past_the_dedup_window_adds_nothing(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """Batches 0-2 are written; the driver is SIGKILLed; batch 2's entry in Spark's
    commit log is removed (the kill landed after the sink's commit and before Spark's),
    and the queue is drained. The driver restarts after more than the broker's dedup
    window: batch 2 is replayed and adds nothing (its commit mark), batches 3-4 arrive
    once. The driver's log has the per-task counts."""
    broker = broker_factory("--dedup-window", str(WINDOW))
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        uri = unique_uri("stream-write")
        source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
        source.mkdir()
        for batch in range(3):
            add_batch(source, batch)
        args = ["write-stream", "--uri", uri, "--address", proxy.address]
        args += ["--checkpoint", str(checkpoint), "--source", str(source)]
        with DriverProcess(args) as driver:
            driver.wait_for("progress 2", 150)
            driver.kill()
        assert "rows from 1 tasks" in driver.stderr  # per-task counts in the driver's log
        first = drain_messages(broker.address, uri, 300)
        for name in ("2", ".2.crc"):
            (checkpoint / "commits" / name).unlink(missing_ok=True)
        time.sleep(WINDOW + 1.0)  # past the dedup window: the GUIDs are forgotten
        for batch in (3, 4):
            add_batch(source, batch)
        with DriverProcess(args) as driver:
            driver.wait_for("progress 4", 150)
            driver.kill()
        second = drain_messages(broker.address, uri, 200)
    ids = Counter(json.loads(m.payload)["order_id"] for m in first + second)
    assert len(first) == 300 and len(second) == 200
    assert ids == Counter(range(500))
    assert "was already committed; this replay wrote nothing" in driver.stderr


@pytest.mark.timeout(240)
def test_exactly_once_source_through_a_driver_kill_loses_and_repeats_nothing(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """1,500 messages are read in batches of 500 with a write-ahead log; the driver is
    SIGKILLed after the sink wrote batch 2 and before Spark committed it. The restarted
    driver replays batch 2 from the log, the broker's redeliveries of its messages are
    recognised, and 500 more messages follow: every message is in the output once."""
    uri = unique_uri("stream-read")
    out, checkpoint, wal = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "wal"
    out.mkdir()
    posted: list[uuid.UUID] = []
    post = functools.partial(post_more, broker, uri, posted)

    post(1_500)
    args = ["read-stream", "--uri", uri, "--address", broker.address]
    args += ["--checkpoint", str(checkpoint), "--out", str(out), "--wal", str(wal)]
    with DriverProcess([*args, "--hold-batch", "2"]) as driver:
        driver.wait_for("holding 2", 150)
        driver.kill()
    post(500)
    with DriverProcess(args) as driver:

        def delivered() -> int:
            return sum(len(p.read_text().split()) for p in out.glob("batch-*.txt"))

        deadline = time.monotonic() + 150
        while delivered() < 2_000 and time.monotonic() < deadline:
            driver.wait_for("progress", 150)
            time.sleep(0.5)  # polling the output files, bounded by the deadline
        time.sleep(2.0)  # a duplicate right behind the last batch would show up here
        driver.kill()
    seen = read_output(out)
    assert [g for g, n in seen.items() if n > 1] == []
    assert set(seen) == set(posted)
    # Spark tells a source its batch is committed when it plans the next batch: only
    # the last batch may still be unconfirmed (and is recognised if redelivered).
    last = max(out.glob("batch-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
    unconfirmed = {m.guid for m in drain_messages(broker.address, uri, 0)}
    assert unconfirmed <= {uuid.UUID(line) for line in last.read_text().split()}


@pytest.mark.timeout(420)
def test_exactly_once_source_through_broker_kill_proxy_kill_and_graceful_stop(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """The exactly-once source (``walPath``) reads 3,000 messages through a proxy from a
    sqlite broker that is SIGKILLed and restarted mid-stream; then the proxy is
    SIGKILLed and restarted; then the driver is stopped gracefully (SIGTERM:
    ``query.stop()``) and started again. Each fault leaves deliveries unconfirmed,
    which the broker redelivers with a higher count: none may reach the output twice,
    and every message reaches it."""
    broker = broker_factory("--store", f"sqlite:{tmp_path / 'broker.db'}")
    uri = unique_uri("stream-read-faults")
    out, checkpoint, wal = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "wal"
    out.mkdir()
    posted: list[uuid.UUID] = []
    post = functools.partial(post_more, broker, uri, posted)

    def delivered() -> int:
        return sum(read_output(out).values())

    def progress_past(driver: DriverProcess, rows: int, timeout: float = 150) -> None:
        deadline = time.monotonic() + timeout
        while delivered() < rows:
            assert time.monotonic() < deadline, f"{delivered()} rows, waited for {rows}"
            driver.wait_for("progress", timeout)
            time.sleep(0.2)  # polling the output files, bounded by the deadline

    post(1_500)
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        args = ["read-stream", "--uri", uri, "--address", proxy.address]
        args += ["--checkpoint", str(checkpoint), "--out", str(out), "--wal", str(wal)]
        with DriverProcess(args) as driver:
            progress_past(driver, 500)
            broker.kill()  # deliveries of the batch being read stay unconfirmed
            broker.restart()
            post(1_000)
            progress_past(driver, 1_500)
            proxy.kill()
            proxy.restart()
            progress_past(driver, 2_000)
            driver.stop()
        post(500)
        with DriverProcess(args) as driver:
            progress_past(driver, 3_000)
            time.sleep(2.0)  # a duplicate right behind the last batch would show up here
            driver.stop()
    seen = read_output(out)
    assert [g for g, n in seen.items() if n > 1] == []
    assert set(seen) == set(posted)

"""Every loss of a Redis store detected (issue #32): Redis restarted from an older
snapshot or flushed is reported LOST DATA with what the node can count and a
``DataLost`` event, within a beat of the next renewal; AOF ``always`` loses nothing
and reports nothing; with ``--redis-min-replicas`` a message is delivered only once
replicas have it; a dead node's keys are all gone after twice the lease."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import redis

from holdfast.sdk import AckStatus, CallLostError, DataLost, Message, QueueOptions, Session
from holdfast.sdk.admin import AdminClient
from tests.redis.fencing_kit import Deliveries, Events
from tests.redis.test_nodes import Acks
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

URI = "hf://loss/orders"
LEASE = ["--redis-lease", "1.5"]


def test_redis_back_from_an_older_snapshot_is_reported_with_what_was_acked(
    tmp_path: Path,
) -> None:
    with (
        RedisServer(tmp_path / "redis", aof=False) as redis,  # RDB only: Redis's default
        BrokerProcess(["--store", redis.url, *LEASE]) as broker,
    ):
        events = Events()
        with Session(broker.address, options=FAST, on_event=events) as session:
            acks = Acks()
            queue = session.open_queue(URI, write=True, on_ack=acks)
            kept = [queue.post(b"kept-%d" % i) for i in range(100)]
            assert session.flush(timeout=30)
            assert redis.cli("SAVE") == "OK"
            lost = [queue.post(b"lost-%d" % i) for i in range(1000)]
            assert session.flush(timeout=30)
            acks.exactly_one_success(kept + lost)
            redis.restart()  # kill -9, then back from the snapshot
            try:
                wait_until(lambda: events.of(DataLost), 15, "a DataLost event")
            except AssertionError:
                print(broker.output)
                raise
            wait_until(lambda: len(events.of(DataLost)) >= 2, 5, "the queue's DataLost")
            got = Deliveries()
            session.open_queue(URI, read=True, on_message=got)
            wait_until(lambda: got.count() >= 100, 15, "the snapshot's messages")
        reports = [e for e, _ in events.of(DataLost)]
        assert {e.queue_uri for e in reports} == {None, URI}  # type: ignore[attr-defined]
        [line] = [line for line in broker.output.splitlines() if "LOST DATA" in line]
        assert "went back" in line
        counted = int(re.search(r"up to (\d+) messages", line).group(1))  # type: ignore[union-attr]
        assert 1000 <= counted <= 1100, line
        assert f"{URI} ({counted})" in line
        assert set(got.guids()) == set(kept)


def test_a_snapshot_restart_after_the_lease_with_posts_going_on_is_reported(
    tmp_path: Path,
) -> None:
    """Redis out for longer than the lease while a producer goes on posting, then back
    from its snapshot (issue #32): the node rejoined under a new incarnation and the
    first PUT raised the queue's write sequence back to what the node had seen, so
    neither check saw the 1,000 lost messages. The node mark does."""
    with (
        RedisServer(tmp_path / "redis", aof=False) as redis,
        BrokerProcess(["--store", redis.url, *LEASE]) as broker,
    ):
        events = Events()
        with Session(broker.address, options=FAST, on_event=events) as session:
            queue = session.open_queue(URI, write=True)
            for i in range(100):
                queue.post(b"kept-%d" % i)
            assert session.flush(timeout=30)
            assert redis.cli("SAVE") == "OK"
            queue.post_many([b"lost-%d" % i for i in range(1000)])  # one script
            assert session.flush(timeout=30)
            time.sleep(1.0)  # a renewal after the PUTs: the loss is the snapshot's
            redis.kill()
            stop = threading.Event()

            def produce() -> None:
                while not stop.wait(0.005):
                    queue.post(b"after")

            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            try:
                time.sleep(3.0)  # twice the lease: the node lapses
                redis.restart()  # back from the snapshot
                wait_until(lambda: events.of(DataLost), 15, "a DataLost event")
                wait_until(lambda: len(events.of(DataLost)) >= 2, 5, "the queue's DataLost")
            except AssertionError:
                print(broker.output)
                raise
            finally:
                stop.set()
                producer.join(10)
            assert session.flush(timeout=30)
        reports = [e for e, _ in events.of(DataLost)]
        assert {e.queue_uri for e in reports} == {None, URI}  # type: ignore[attr-defined]
        [line] = [line for line in broker.output.splitlines() if "LOST DATA" in line]
        counted = int(re.search(r"up to (\d+) messages", line).group(1))  # type: ignore[union-attr]
        assert counted >= 1000 and f"{URI} ({counted})" in line, line


def test_redis_flushed_is_reported_to_every_session(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url, *LEASE]) as broker,
    ):
        events = Events()
        with Session(broker.address, options=FAST, on_event=events) as session:
            queue = session.open_queue(URI, write=True)
            for i in range(10):
                queue.post(b"m%d" % i)
            assert session.flush(timeout=30)
            assert redis.cli("FLUSHALL") == "OK"
            wait_until(lambda: events.of(DataLost), 15, "a DataLost event")
    assert broker.count("LOST DATA") == 1
    assert "flushed" in broker.output


def test_a_deleted_queue_is_no_loss_and_a_rollback_after_the_delete_is(tmp_path: Path) -> None:
    """``holdfast delete`` of a queue the node wrote (issue #32): the delete removed its
    write sequence, the node's next beat read 0, below what it had seen, and reported
    LOST DATA. The sequence now stays, expiring; the queue made again goes on from it;
    and Redis back from a snapshot taken after the delete is still reported."""
    seq = "hf:{" + URI + "}:seq"
    with (
        RedisServer(tmp_path / "redis", aof=False) as redis,
        BrokerProcess(["--store", redis.url, *LEASE]) as broker,
    ):
        events = Events()
        with (
            Session(broker.address, options=FAST, on_event=events) as session,
            AdminClient(broker.address) as admin,
        ):
            queue = session.open_queue(URI, write=True)
            for i in range(10):
                queue.post(b"m%d" % i)
            assert session.flush(timeout=30)
            queue.close()
            wait_until(lambda: admin.stats(URI).handles == 0, 5, "the handle gone")
            kept = int(redis.cli("GET", seq))
            assert admin.delete(URI) == 10
            assert redis.cli("SAVE") == "OK"  # the queue deleted, its sequence kept
            time.sleep(2.0)  # four beats of a 1.5 s lease read the sequences back
            assert broker.count("LOST DATA") == 0, broker.output
            assert not events.of(DataLost)
            assert redis.cli("GET", seq) == str(kept)
            assert 3600 < int(redis.cli("TTL", seq)) <= 7200  # then it expires
            queue = session.open_queue(URI, write=True)
            queue.post_many([b"lost-%d" % i for i in range(100)])  # one script
            assert session.flush(timeout=30)
            assert int(redis.cli("GET", seq)) > kept and redis.cli("TTL", seq) == "-1"
            redis.restart()  # back from the snapshot: the queue deleted, 100 ACKs gone
            try:
                wait_until(lambda: events.of(DataLost), 15, "a DataLost event")
            except AssertionError:
                print(broker.output)
                raise
    [line] = broker.lines_with("LOST DATA")
    assert f"{URI} (100)" in line, line


def test_redis_with_aof_always_restarts_without_loss_or_report(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,  # appendfsync always
        BrokerProcess(["--store", redis.url, *LEASE]) as broker,
    ):
        events = Events()
        with Session(broker.address, options=FAST, on_event=events) as session:
            queue = session.open_queue(URI, write=True)
            guids = [queue.post(b"m%d" % i) for i in range(500)]
            assert session.flush(timeout=30)
            redis.restart()
            got = Deliveries()
            session.open_queue(URI, read=True, on_message=got)
            wait_until(lambda: got.count() >= 500, 20, "every message")
            time.sleep(2 * 1.5)  # two leases: renewals read the mark back meanwhile
        assert sorted(got.guids()) == sorted(guids)
        assert not events.of(DataLost)
    assert broker.count("LOST DATA") == 0


def _keys(server: RedisServer) -> set[bytes]:
    client = redis.Redis(port=server.port)
    try:
        return set(client.scan_iter(count=1000))
    finally:
        client.close()


def test_a_killed_nodes_keys_are_gone_after_twice_the_lease(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url, *LEASE]) as b,
    ):
        with Session(b.address, options=FAST) as session:
            queue = session.open_queue(URI, write=True)
            for i in range(50):
                queue.post(b"m%d" % i)
            assert session.flush(timeout=30)
            # Deliver them once on B and give them back, so that their delivery counts
            # (message content) exist before the count.
            once = Deliveries(hold=True)
            reader = session.open_queue(URI, read=True, on_message=once)
            wait_until(lambda: once.count() >= 50, 15, "50 deliveries on B")
            reader.close()
        wait_until(lambda: redis.cli("LLEN", "hf:{" + URI + "}:ready") == "50", 10, "requeue")
        before = _keys(redis)
        with BrokerProcess(["--store", redis.url, *LEASE]) as a:
            holder = Session(a.address, options=FAST)
            held = Deliveries(hold=True)
            holder.open_queue(
                URI, read=True, on_message=held, options=QueueOptions(max_unconfirmed_messages=20)
            )
            holder.open_queue("hf://loss/other", write=True)
            wait_until(lambda: held.count() >= 20, 15, "20 deliveries on A")
            assert _keys(redis) - before, "node A wrote no keys of its own"
            a.kill()
            killed = time.monotonic()
            holder.close(timeout=1)
        # All but its node mark (a lapsed node reads it as it rejoins), which expires.
        wait_until(lambda: len(_keys(redis) - before) <= 1, 10, "A's keys gone")
        assert time.monotonic() - killed <= 2 * 1.5 + 1.0  # twice the lease, and a beat
        [mark] = _keys(redis) - before
        assert mark.startswith(b"hf:node-mark:{"), mark
        assert 0 < int(redis.cli("TTL", mark.decode())) <= 3600
        assert redis.cli("LLEN", "hf:{" + URI + "}:ready") == "50"


def test_with_min_replicas_a_message_is_delivered_once_replicas_have_it(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "primary") as primary:
        replica = RedisServer(
            tmp_path / "replica", extra=("--replicaof", "127.0.0.1", str(primary.port))
        ).start()
        try:
            wait_until(
                lambda: "state=online" in primary.cli("INFO", "replication"), 15, "replica in sync"
            )
            with (
                BrokerProcess(["--store", primary.url, "--redis-min-replicas", "1"]) as broker,
                Session(broker.address, options=FAST) as session,
            ):
                acks = Acks()
                got = Deliveries()
                queue = session.open_queue(URI, write=True, read=True, on_ack=acks, on_message=got)
                synced = queue.post(b"synced")
                assert session.flush(timeout=30)
                wait_until(lambda: got.count() == 1, 10, "the replicated message")
                os.kill(replica.pid, signal.SIGSTOP)  # it stops acknowledging
                try:
                    waiting = queue.post(b"waiting")
                    assert session.flush(timeout=30)
                    assert acks.statuses[waiting] == [AckStatus.UNKNOWN]
                    deadline = time.monotonic() + 3
                    while time.monotonic() < deadline:
                        assert got.count() == 1, "delivered before any replica had it"
                        time.sleep(0.05)
                finally:
                    os.kill(replica.pid, signal.SIGCONT)
                wait_until(lambda: got.count() == 2, 15, "the message once replicated")
                assert got.guids() == [synced, waiting]
        finally:
            replica.stop()


def test_a_call_in_flight_fails_at_once_when_the_store_loses_data(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        BrokerProcess(["--store", redis.url, *LEASE]) as broker,
        Session(broker.address, options=FAST) as caller,
    ):
        # No worker: the call waits for a reply that, once Redis lost its request, would
        # never come; it must not wait out its 60 s.
        future = caller.request_async("hf://loss/service", b"question", timeout=60)
        time.sleep(0.3)  # the request PUT is ACKed and waiting in Redis
        started = time.monotonic()
        assert redis.cli("FLUSHALL") == "OK"
        with pytest.raises(CallLostError, match="LOST DATA"):
            future.result(timeout=15)
        assert time.monotonic() - started < 5


def test_after_a_rollback_confirms_are_reapplied_and_counts_never_go_back(
    tmp_path: Path,
) -> None:
    done, held = "hf://loss/confirmed", "hf://loss/held"
    with (
        RedisServer(tmp_path / "redis", aof=False) as redis,
        BrokerProcess(["--store", redis.url, *LEASE]) as broker,
    ):
        events = Events()
        with Session(broker.address, options=FAST, on_event=events) as session:
            for uri in (done, held):
                queue = session.open_queue(uri, write=True)
                for i in range(20):
                    queue.post(b"m%d" % i)
            assert session.flush(timeout=30)
            assert redis.cli("SAVE") == "OK"  # every message ready, never delivered
            confirmed = Deliveries()
            session.open_queue(done, read=True, on_message=confirmed)
            wait_until(lambda: redis.cli("HLEN", "hf:{" + done + "}:body") == "0", 15, "confirms")
            with Session(broker.address, options=FAST) as holder:
                once = Deliveries(hold=True)
                holder.open_queue(held, read=True, on_message=once)
                wait_until(lambda: once.count() >= 20, 15, "20 held")
            assert confirmed.count() == 20
            redis.restart()  # back to the snapshot: 40 ready, no delivery counted
            wait_until(lambda: events.of(DataLost), 15, "the loss reported")
            again = Deliveries()
            session.open_queue(done, read=True, on_message=again)
            counts: dict[int, int] = {}

            def count(message: Message) -> None:
                counts[message.delivery_count] = counts.get(message.delivery_count, 0) + 1
                message.confirm()

            session.open_queue(held, read=True, on_message=count)
            wait_until(lambda: sum(counts.values()) >= 20, 15, "the held ones again")
            time.sleep(1.0)  # room for a wrong delivery of a confirmed one
        redelivered = again.count() + confirmed.count() - 20
        assert redelivered == 0, "messages confirmed before the loss were delivered again"
        assert counts == {2: 20}, counts  # seen once before: the count goes on from there
    assert broker.count("confirms re-applied") >= 1

"""``redis+sentinel://``: the broker asks Sentinel for the primary, so a failover that
Sentinel runs (the primary ``kill -9``ed, its replica promoted) is followed by the
same broker process without an operator. ACKed PUTs (``--redis-min-replicas 1``)
are all there after it, once each; without it, a failover onto a replica that lagged
loses ACKed PUTs, and the broker reports them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.sdk import AckStatus, DataLost, Session
from tests.policies.support import Collector
from tests.redis.fencing_kit import Events
from tests.redis.test_nodes import URI, Acks
from tests.support.processes import BrokerProcess
from tests.support.redis_server import REDIS_CLI, REDIS_SERVER, RedisServer, free_port
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SERVICE = "holdfast"


def _sentinel(directory: Path, primary_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """Start one Sentinel watching the primary (quorum 1, down after 1 s)."""
    port = free_port()
    config = directory / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 5000\n"
    )
    process = subprocess.Popen(
        [REDIS_SERVER, str(config), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return process, port


def _primary_port(sentinel_port: int) -> int:
    done = subprocess.run(
        [REDIS_CLI, "-p", str(sentinel_port), "SENTINEL", "get-master-addr-by-name", SERVICE],
        capture_output=True,
        text=True,
        timeout=10,
    )
    lines = done.stdout.split()
    return int(lines[1]) if len(lines) == 2 else 0


@contextlib.contextmanager
def watched_pair(tmp_path: Path, aof: bool) -> Iterator[tuple[RedisServer, RedisServer, int]]:
    """A primary, its replica in sync, and one Sentinel watching them: ``(primary,
    replica, sentinel port)``; all three stopped by PID at the end."""
    primary = RedisServer(tmp_path / "primary", aof=aof).start()
    replica = RedisServer(
        tmp_path / "replica", aof=aof, extra=("--replicaof", "127.0.0.1", str(primary.port))
    ).start()
    (tmp_path / "sentinel").mkdir()
    sentinel, sentinel_port = _sentinel(tmp_path / "sentinel", primary.port)
    try:
        wait_until(lambda: "state=online" in primary.cli("INFO", "replication"), 15, "replica")
        wait_until(lambda: _primary_port(sentinel_port) == primary.port, 15, "the Sentinel")
        yield primary, replica, sentinel_port
    finally:
        os.kill(sentinel.pid, signal.SIGKILL)
        sentinel.wait(10)
        replica.stop()
        primary.stop()


def test_a_sentinel_failover_is_followed_and_loses_nothing_acked(tmp_path: Path) -> None:
    with watched_pair(tmp_path, aof=True) as (primary, replica, sentinel_port):
        store = f"redis+sentinel://127.0.0.1:{sentinel_port}/{SERVICE}"
        acks = Acks()
        got = Collector()
        with (
            BrokerProcess(["--store", store, "--redis-min-replicas", "1"]) as broker,
            Session(broker.address, options=FAST) as session,
        ):
            queue = session.open_queue(URI, write=True, on_ack=acks)
            guids = [queue.post(b"m%d" % i) for i in range(2000)]
            assert session.flush(timeout=30)
            primary.kill()
            wait_until(lambda: _primary_port(sentinel_port) == replica.port, 30, "the failover")
            session.open_queue(URI, read=True, on_message=got)  # the same broker process
            try:
                got.wait_for(len(guids), timeout=30)
            except AssertionError:
                print(broker.output[-8000:])  # shown with the failure: what the node did
                print(_where_they_are(replica))  # ...and where the missing ones wait
                raise
            # Writes not waited for (claims, promotions) may be lost by a failover and
            # are reported; no message ACKed SUCCESS may be among what is lost.
            for line in broker.output.splitlines():
                if "LOST DATA" in line:
                    assert "0 messages this node ACKed SUCCESS" in line, line
    assert [acks.statuses.get(g) for g in guids] == [[AckStatus.SUCCESS]] * len(guids)
    assert Counter(got.guids()) == Counter({g: 1 for g in guids})


def test_a_failover_onto_a_lagging_replica_reports_what_it_lost(tmp_path: Path) -> None:
    """Without ``--redis-min-replicas``: the replica is stopped (SIGSTOP) while 5,000
    PUTs are ACKed SUCCESS by the primary, the primary is ``kill -9``ed, the replica
    resumes and Sentinel promotes it without those writes. The broker follows the
    failover, logs LOST DATA with a bound on what it had ACKed since, and the session
    gets a ``DataLost`` event: every ACKed message is either delivered or within that
    bound, never lost in silence."""
    events = Events()
    with watched_pair(tmp_path, aof=False) as (primary, replica, sentinel_port):
        store = f"redis+sentinel://127.0.0.1:{sentinel_port}/{SERVICE}"
        acks = Acks()
        got = Collector()
        with (
            BrokerProcess(["--store", store]) as broker,
            Session(broker.address, options=FAST, on_event=events) as session,
        ):
            queue = session.open_queue(URI, write=True, on_ack=acks)
            before = [queue.post(b"before-%d" % i) for i in range(200)]
            assert session.flush(timeout=30)
            wait_until(lambda: _replica_offset(replica) >= _primary_offset(primary), 15, "sync")
            os.kill(replica.pid, signal.SIGSTOP)  # it lags: the primary keeps its writes
            try:
                # 20 MB: more than loopback's socket buffers hold for the stopped replica.
                lagging = [queue.post(b"%d" % i + bytes(4096)) for i in range(5000)]
                assert session.flush(timeout=30)
                primary.kill()
            finally:
                os.kill(replica.pid, signal.SIGCONT)
            wait_until(lambda: _primary_port(sentinel_port) == replica.port, 30, "the failover")
            wait_until(lambda: broker.count("LOST DATA") >= 1, 30, "the loss reported")
            wait_until(lambda: events.of(DataLost), 15, "a DataLost event")
            survivors = int(replica.cli("HLEN", "hf:{" + URI + "}:body"))
            session.open_queue(URI, read=True, on_message=got)
            got.wait_for(survivors, timeout=30)
            report = next(line for line in broker.output.splitlines() if "LOST DATA" in line)
    acked = {g for g in before + lagging if acks.statuses.get(g) == [AckStatus.SUCCESS]}
    assert len(acked) == 5200
    delivered = Counter(got.guids())
    assert set(delivered) <= acked and set(before) <= set(delivered)
    assert len(delivered) == survivors and max(delivered.values()) == 1
    missing = len(acked) - survivors
    assert missing > 0, "nothing was lost: the replica did not lag"
    bound = int(report.split("up to ")[1].split(" messages")[0])
    assert missing <= bound, report


def _where_they_are(server: RedisServer) -> str:
    """The queue's lists in Redis, for a failure's report: ready, held back for the
    replicas, and held by each node as delivered."""
    prefix = "hf:{" + URI + "}:"
    parts = [
        f"ready {server.cli('LLEN', prefix + 'ready')}",
        f"unsynced {server.cli('LLEN', prefix + 'unsynced')}",
        f"messages {server.cli('HLEN', prefix + 'body')}",
    ]
    for key in server.cli("KEYS", prefix + "out:*").split():
        parts.append(f"{key} {server.cli('ZCARD', key)}")
    return "; ".join(parts)


def _offset(server: RedisServer, field: str) -> int:
    info = server.cli("INFO", "replication")
    for line in info.splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    return -1


def _primary_offset(primary: RedisServer) -> int:
    return _offset(primary, "master_repl_offset")


def _replica_offset(replica: RedisServer) -> int:
    return _offset(replica, "slave_repl_offset")

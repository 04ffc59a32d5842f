"""Transactional writes through ``format("holdfast")`` onto a broker on the Redis store,
counting rows in the queue exactly: a write job publishes each row once and records its
commit mark in Redis (the job run again under its run id adds nothing); a task retried
later than the dedup window adds nothing, directly and through the proxy (its failed
attempt's staged rows are discarded, not published); a failed job leaves nothing
visible. A redis-server and the brokers are started here and stopped by PID."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark import cloudpickle

from holdfast.broker.redis.keys import QueueKeys
from holdfast.sdk.spark import register
from tests.spark import faults
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import drain_messages, unique_uri

cloudpickle.register_pickle_by_value(faults)  # type: ignore[no-untyped-call]

WINDOW = 1.0
"""The broker's dedup window in these tests (seconds)."""


@pytest.fixture(scope="module")
def hf(spark: Any) -> Any:
    """The module's SparkSession with ``format("holdfast")`` registered."""
    register(spark)
    return spark


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the module (each test writes queues of its own)."""
    with RedisServer(tmp_path_factory.mktemp("spark-redis"), aof=False) as server:
        yield server


@pytest.fixture
def redis_broker(
    broker_factory: Callable[..., BrokerProcess], redis_server: RedisServer
) -> BrokerProcess:
    """A broker on the Redis store with a 1 s dedup window."""
    return broker_factory("--store", redis_server.url, "--dedup-window", str(WINDOW))


def orders(hf: Any, total: int, fault: Any = None) -> Any:
    df = hf.range(0, total, numPartitions=4).selectExpr("id AS order_id", "id * 3 AS amount")
    if fault is None:
        return df
    return hf.createDataFrame(df.rdd.mapPartitions(fault), df.schema)


def write(df: Any, uri: str, address: str, run_id: str | None = None) -> None:
    writer = (
        df.write.format("holdfast")
        .option("uri", uri)
        .option("address", address)
        .option("keyColumn", "order_id")
    )
    if run_id is not None:
        writer = writer.option("runId", run_id)
    writer.mode("append").save()


def counted(address: str, uri: str, total: int) -> Counter[int]:
    return Counter(json.loads(m.payload)["order_id"] for m in drain_messages(address, uri, total))


@pytest.mark.timeout(240)
def test_a_write_job_publishes_each_row_once_and_its_rerun_adds_nothing(
    hf: Any, redis_broker: BrokerProcess, redis_server: RedisServer
) -> None:
    total, uri = 30_000, unique_uri("redis-job")
    write(orders(hf, total), uri, redis_broker.address, run_id="redis-job-1")
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        # Staged, then committed: the mark is Redis's, nothing is left staged.
        prefix = QueueKeys(uri).prefix
        assert client.hlen(prefix + "marks") == 1
        assert list(client.scan_iter(match=prefix + "st:*")) == []
    finally:
        client.close()
    write(orders(hf, total), uri, redis_broker.address, run_id="redis-job-1")
    assert counted(redis_broker.address, uri, total) == Counter(range(total))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", ["direct", "proxy"])
def test_a_task_retried_after_the_dedup_window_adds_nothing(
    hf: Any, redis_broker: BrokerProcess, tmp_path: Path, path: str
) -> None:
    """Partition 2's first attempt stages 4,000 rows, stalls past the 1 s window and
    fails; its retry stages them again: the queue holds each of the 20,000 rows once."""
    total, uri = 20_000, unique_uri("redis-late-retry")
    fault = faults.LateFailure(str(tmp_path), 2, 4_000, WINDOW * 2.5, every_attempt=False)
    if path == "proxy":
        with ProxyProcess(["--upstream", redis_broker.address]) as proxy:
            write(orders(hf, total, fault), uri, proxy.address)
    else:
        write(orders(hf, total, fault), uri, redis_broker.address)
    assert (tmp_path / "failed-p2-a0").read_text() == "4000"
    assert counted(redis_broker.address, uri, total) == Counter(range(total))


@pytest.mark.timeout(240)
def test_a_failed_job_leaves_nothing_visible(
    hf: Any, redis_broker: BrokerProcess, tmp_path: Path
) -> None:
    """Every attempt of partition 3 fails after 1,000 rows; the other partitions' tasks
    staged 15,000 rows: the job fails and the queue stays empty."""
    uri = unique_uri("redis-failed-job")
    fault = faults.LateFailure(str(tmp_path), 3, 1_000, 0.0, every_attempt=True)
    with pytest.raises(Exception, match="injected failure after 1000 rows"):
        write(orders(hf, 20_000, fault), uri, redis_broker.address)
    assert (tmp_path / "failed-p3-a0").exists()
    assert drain_messages(redis_broker.address, uri, 0) == []

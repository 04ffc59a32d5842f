"""The source's readers when the broker delivers a message again while the reader holds
it: after a reconnect, every message the connection before left unconfirmed comes back,
whether it still waits for a batch or is in one already.

The readers are driven here as Spark drives them (the streaming reader's
``latestOffset``, ``partitions``, ``read``, ``commit``; the batch reader's ``read`` of
its partition) without a JVM: what is tested is which rows they give and what reaches
the broker, which happens in these calls.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from holdfast.sdk.spark.batch_read import QueueBatchReader, QueuePartition
from holdfast.sdk.spark.options import ReadOptions
from holdfast.sdk.spark.source import QueueStreamReader
from holdfast.sdk.types import Message
from tests.spark.test_connector_stream import post_more
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import drain_messages, unique_uri
from tests.support.waiting import wait_until

COUNT = 300


class _Handled:
    """Counts the deliveries the reader has handled (its ``on_message`` returned):
    the session's own count moves when a PUSH arrives, before its handler ran."""

    def __init__(self, reader: QueueStreamReader) -> None:
        self.count = 0
        self._lock = threading.Lock()
        handle = reader._on_message

        def counted(message: Message) -> None:
            handle(message)
            with self._lock:
                self.count += 1

        reader._on_message = counted  # type: ignore[method-assign]
        reader._ensure_session()


def _guids(reader: QueueStreamReader, start: int, end: int) -> list[uuid.UUID]:
    partitions = reader.partitions({"seq": start}, {"seq": end})
    return [uuid.UUID(row[4]) for part in partitions for row in reader.read(part)]


def _reconnect_through(proxy: ProxyProcess, handled: _Handled, count: int) -> None:
    """Cut the reader's connection (SIGKILL its proxy and start it again) and wait
    until the reader has handled ``count`` deliveries in all."""
    proxy.kill()
    proxy.restart()
    wait_until(lambda: handled.count >= count, 60, f"{count} deliveries handled")


@pytest.fixture(params=["exactly-once", "at-least-once"])
def options(request: pytest.FixtureRequest, tmp_path: Path) -> ReadOptions:
    wal = str(tmp_path / "wal") if request.param == "exactly-once" else None
    return ReadOptions(uri=unique_uri("source-redelivery"), wal_path=wal, max_rows_per_batch=1000)


@contextlib.contextmanager
def _reading(
    broker: BrokerProcess, options: ReadOptions
) -> Iterator[tuple[QueueStreamReader, ProxyProcess, _Handled, list[uuid.UUID]]]:
    """``COUNT`` messages posted (their GUIDs given), and a reader through a proxy that
    has handled their first deliveries. Afterwards the reader and the proxy are
    stopped, and the broker's queue must be empty: every message confirmed."""
    posted: list[uuid.UUID] = []
    post_more(broker, options.uri, posted, COUNT)
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        reader = QueueStreamReader(replace(options, address=proxy.address))
        try:
            handled = _Handled(reader)
            wait_until(lambda: handled.count >= COUNT, 60, "the backlog")
            yield reader, proxy, handled, posted
        finally:
            reader.stop()
    assert drain_messages(broker.address, options.uri, 0) == []


@pytest.mark.timeout(120)
def test_a_message_delivered_again_before_a_batch_takes_it_goes_into_the_batch_once(
    broker: BrokerProcess, options: ReadOptions, caplog: pytest.LogCaptureFixture
) -> None:
    with _reading(broker, options) as (reader, proxy, handled, posted):
        _reconnect_through(proxy, handled, 2 * COUNT)
        end = reader.latestOffset({"seq": 0}, ReadMaxRows(10 * COUNT))
        assert end == {"seq": COUNT}
        guids = _guids(reader, 0, COUNT)
        assert sorted(guids) == sorted(posted)
        with caplog.at_level(logging.WARNING, logger="holdfast.sdk.spark"):
            reader.commit(end)
        # Only the newest delivery of each was confirmed: none was dropped.
        assert "CONFIRM was dropped" not in caplog.text


@pytest.mark.timeout(120)
def test_a_message_delivered_again_once_in_a_batch_is_confirmed_with_it_not_read_again(
    broker: BrokerProcess, options: ReadOptions, caplog: pytest.LogCaptureFixture
) -> None:
    with _reading(broker, options) as (reader, proxy, handled, posted):
        first = reader.latestOffset({"seq": 0}, ReadMaxRows(10 * COUNT))
        assert first == {"seq": COUNT}
        guids = _guids(reader, 0, COUNT)
        assert sorted(guids) == sorted(posted)
        # Twice: the batch's messages come a second and a third time before it commits.
        _reconnect_through(proxy, handled, 2 * COUNT)
        _reconnect_through(proxy, handled, 3 * COUNT)
        with caplog.at_level(logging.WARNING, logger="holdfast.sdk.spark"):
            # Spark asks for the next batch once the first is done (which commits it):
            # nothing new came.
            assert reader.latestOffset(first, ReadMaxRows(10 * COUNT)) == first
            reader.commit(first)
        assert "CONFIRM was dropped" not in caplog.text


@pytest.mark.timeout(120)
def test_a_consuming_batch_read_gives_each_message_once_through_a_proxy_kill(
    broker: BrokerProcess,
) -> None:
    """``spark.read`` with ``consume``: the proxy is killed while the task hands a chunk
    to Spark, so the chunk's CONFIRMs are dropped and the broker redelivers it. The task
    does not fail, reads no message twice, and leaves the queue empty."""
    uri = unique_uri("consume-reconnect")
    posted: list[uuid.UUID] = []
    post_more(broker, uri, posted, COUNT)
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        options = ReadOptions(uri=uri, address=proxy.address, max_rows_per_batch=100, consume=True)
        rows = QueueBatchReader(options).read(QueuePartition())
        seen = [next(rows)[4] for _ in range(50)]
        proxy.kill()
        proxy.restart()
        seen += [row[4] for row in rows]
    assert sorted(seen) == sorted(str(guid) for guid in posted)
    assert drain_messages(broker.address, uri, 0) == []

"""A sqlite broker restarted with a longer ``--dedup-window`` than it ran with: its file
holds only the history the shorter window kept, so an unknown GUID older than that is
TOO_OLD (it may have been forgotten) rather than taken as new, until the broker's own
time has filled the longer window. An outside tester's replay was taken, and delivered
a second time. On injected clocks: the store's prune records what its history still
covers (``history_complete_since``), the restarted broker's ``HistoryCover`` refuses
past it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from holdfast.broker import BrokerConfig
from holdfast.broker.dedup import BrokerClock, HistoryCover
from holdfast.broker.server import Broker
from holdfast.broker.sqlite_store import SqliteStore
from holdfast.broker.store import MessageKey, StoreBatch, StoredMessage
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

URI = "hf://window/raised"


def test_a_broker_restarted_with_a_longer_window_vouches_only_for_what_its_file_holds(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broker.db"
    ticks = [1000.0]
    first = BrokerClock(lambda: ticks[0])
    store = SqliteStore(path, dedup_window=1, dedup_grace=0.5, prune_interval=0.01, clock=first)
    accepted_at = first()
    message = StoredMessage(URI, uuid.uuid4().bytes, b"once", {}, accepted_at)

    async def write(batch: StoreBatch) -> None:
        await asyncio.wait_for(store.write(batch), 30)

    try:
        asyncio.run(write(StoreBatch(messages=[message])))
        asyncio.run(write(StoreBatch(removed=[MessageKey(URI, message.guid)])))  # confirmed
        ticks[0] += 2.0  # past the window and grace: the history row is pruned
        wait_until(lambda: store.pruned == 1, 10, "the history row pruned")
    finally:
        store.close()

    later = [5.0]  # the next run's monotonic clock starts anywhere
    config = BrokerConfig(
        listen="127.0.0.1:0", store=f"sqlite:{path}", dedup_window=300, dedup_grace=0.5
    )
    broker = Broker(config, clock=BrokerClock(lambda: later[0]))

    async def recover() -> None:
        broker.recover()

    asyncio.run(recover())
    try:
        cover = broker.puts.cover
        # Resumed at the prune (1002 s): the file covers acceptances after 1000 s, so a
        # replay up to 1.5 s old (less the grace for its time in flight) still finds
        # its original; one older may not, and is TOO_OLD, not new.
        assert broker.clock() == pytest.approx(accepted_at + 2.0)
        assert cover.max_age_ms(broker.clock()) == 1500
        later[0] += 100
        assert cover.max_age_ms(broker.clock()) == 101_500
        later[0] += 200
        assert cover.max_age_ms(broker.clock()) == 300_000  # the window is filled
    finally:
        broker.store.close()


def test_a_window_that_did_not_grow_is_whole_at_once() -> None:
    cover = HistoryCover(300, 30)
    assert cover.max_age_ms(0.0) == 300_000
    # Pruned under the same window (330 s of retention): it covers the window.
    cover.recovered(complete_since=1000.0)
    assert cover.max_age_ms(1330.0) == 300_000
    cover.recovered(None)
    assert cover.max_age_ms(0.0) == 300_000

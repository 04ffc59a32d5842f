"""Pieces of the Redis store on their own: a sweep pass over open queues is bounded;
store addresses parse."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import pytest

from holdfast.broker.redis.client import RedisSpec, parse_redis_spec
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.sweep import FULL_BATCH, Sweeper


@dataclass
class _Queue:
    uri: str


def test_passes_over_many_open_queues_visit_each_in_turn_and_a_bounded_number_at_once() -> None:
    queues = [_Queue(f"hf://many/q{i:05d}") for i in range(FULL_BATCH * 2 + 100)]
    registry = cast(RedisRegistry, cast(Any, queues))  # iterating it is all a slice needs
    sweeper = Sweeper(registry)
    slices = [sweeper._next_slice() for _ in range(3)]
    assert all(len(chosen) == FULL_BATCH for chosen in slices)
    assert set().union(*slices) == {q.uri for q in queues}  # 3 passes cover all 1100
    few = Sweeper(cast(RedisRegistry, cast(Any, queues[:10])))
    assert few._next_slice() == {q.uri for q in queues[:10]}


def test_redis_store_addresses_parse_or_say_what_is_wrong() -> None:
    sentinel = parse_redis_spec("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/orders/2")
    assert (sentinel.nodes, sentinel.service, sentinel.db) == (
        (("10.0.0.1", 26379), ("10.0.0.2", 26379)),
        "orders",
        2,
    )
    assert parse_redis_spec("rediss://h:6380/1") == RedisSpec("rediss", (("h", 6380),), 1)
    for bad, why in (
        ("redis+sentinel://h:26379", "name the monitored primary"),
        ("redis://a:1,b:2", "one HOST:PORT"),
        ("redis+cluster://a:1/3", "a cluster has only 0"),
        ("redis://h", "expected HOST:PORT"),
        ("mongodb://h:1", "a Redis store is one of"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_redis_spec(bad)


class _RacingClient:
    """A Redis client stand-in whose read of the write sequences returns ``stored``,
    while a script that ran after that read reports ``later`` to the node first."""

    where = "redis test"

    def __init__(self, registry: Any, uri: str, stored: int, later: int) -> None:
        self._registry, self._uri, self._stored, self._later = registry, uri, stored, later

    async def call(self, what: str, read: Any) -> list[Any]:
        self._registry.seqs.saw(self._uri, self._later)  # its reply overtook the read's
        return [str(self._stored).encode()]


def test_a_write_sequence_that_moved_on_during_the_read_is_no_loss() -> None:
    """The node saw 10, reads 10 back, and meanwhile a later script's 11 arrived: Redis
    did not go back. Seen as LOST DATA on a loaded host before the check compared the
    read with what the node had seen before sending it."""
    import asyncio

    from holdfast.broker.redis.losscheck import LossCheck
    from holdfast.broker.redis.losses import AckJournal, DataLoss, SeqBook

    uri = "hf://loss/race"
    registry = SimpleNamespace(seqs=SeqBook(lambda: 100.0), repairing=set())
    registry.seqs.saw(uri, 10)
    registry.client = _RacingClient(registry, uri, stored=10, later=11)
    reports: list[DataLoss] = []
    check = LossCheck(
        cast(RedisRegistry, registry), AckJournal(lambda: 100.0), reports.append, quiet=1.0
    )
    assert asyncio.run(check._went_back()) == {}
    assert registry.seqs.highest(uri) == 11
    # A read below what the node saw before it is a loss, from the second it saw more.
    registry.client = _RacingClient(registry, uri, stored=5, later=11)
    assert asyncio.run(check._went_back()) == {uri: 100.0}


def test_halt_ends_a_loop_whose_work_absorbed_its_cancel() -> None:
    """A cancellation that lands inside a Redis call can be absorbed by the client; the
    node's loop must end all the same (it went on, and ``halt`` waited forever: a
    broker's stop hung, seen in ``make bench``)."""
    import asyncio
    import contextlib

    from holdfast.broker.redis.nodes import NodeLife

    async def scenario() -> None:
        life = object.__new__(NodeLife)  # only the loops: no Redis, no lease
        life._halting = False
        inside = asyncio.Event()
        absorbed: list[bool] = []

        async def absorbing() -> None:
            inside.set()
            if absorbed:  # absorbs one cancel only, so that the test can end either way
                await asyncio.sleep(0.5)
                return
            with contextlib.suppress(asyncio.CancelledError):  # as a retrying client does
                await asyncio.sleep(0.5)
            absorbed.append(True)

        loop_task = asyncio.get_running_loop().create_task(life._every(0.001, absorbing))
        life._tasks = [loop_task]
        await asyncio.wait_for(inside.wait(), 5)
        halting = asyncio.ensure_future(life.halt())
        done, _ = await asyncio.wait({halting}, timeout=5)
        if not done:
            loop_task.cancel()  # ends it: the work absorbs no second cancel
            await halting
        assert done, "halt() still waiting for a loop whose cancel was absorbed"
        assert absorbed and loop_task.done()

    asyncio.run(scenario())

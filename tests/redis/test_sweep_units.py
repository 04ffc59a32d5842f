"""The Redis store's sweep on its own: a pass over open queues is bounded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

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

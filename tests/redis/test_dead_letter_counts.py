"""Each dead letter is counted once in a queue's statistics, however many nodes finish
its move (found by an outside tester: after two ``kill -9`` of one of two nodes,
``holdfast stats`` counted 2013, 2043 and 2006 dead letters for 2000 in the
dead-letter queue).

A move to a dead-letter queue that its node did not finish is finished by another:
the node that reaps it (at once, with every unfinished move of the queue, its own
moves in flight too) or any node's sweep. ``ADD``'s marker and ``GONE`` make the
message move once; the count must follow the move, not each finisher."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from holdfast.broker.redis.keys import QueueKeys
from holdfast.proto.policy import REASON_REJECTED
from tests.redis.lifecycle_world import RedisWorld, in_world

pytestmark = pytest.mark.timeout(60)

MOVES = 50


async def begun_and_abandoned(world: RedisWorld) -> list[bytes]:
    """``MOVES`` messages on their way to the dead-letter queue, as a node leaves them
    when it dies between ``LEAVE`` and ``GONE``."""
    guids = [uuid.uuid4().bytes for _ in range(MOVES)]
    for guid in guids:
        await world.put(guid, None)
    redis = world.client.redis
    await redis.delete(world.keys.ready)
    await redis.hset(
        world.keys.leaving,
        mapping={g: f"{world.clock()}|{REASON_REJECTED}|{world.dead_letter}" for g in guids},
    )
    return guids


def test_a_move_two_nodes_finish_at_once_is_counted_once(redis_url: str) -> None:
    async def body(world: RedisWorld) -> None:
        await world.set_policy(None, None)
        guids = await begun_and_abandoned(world)
        # The survivor reaps (age 0) while the other node's sweep finds them stale.
        finished = await asyncio.gather(
            world.b.graveyard.finish_stale(world.uri, age=0),
            world.a.graveyard.finish_stale(world.uri, age=0),
        )
        assert list(finished) == [MOVES, MOVES]  # both read them before either was done
        await world.settle()
        redis = world.client.redis
        dlq = QueueKeys(world.dead_letter)
        assert await redis.llen(dlq.ready) == MOVES  # moved once each
        assert await redis.hlen(world.keys.leaving) == 0
        assert not any([await redis.hexists(world.keys.body, g) for g in guids])
        stats = await redis.hgetall(world.keys.stats)
        assert stats.get(f"dead:{REASON_REJECTED}".encode()) == str(MOVES).encode(), stats
        moved = world.a.graveyard.moved + world.b.graveyard.moved
        assert moved[REASON_REJECTED] == MOVES

    in_world(redis_url, body)

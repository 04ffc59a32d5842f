"""A script that takes messages into a node's deliveries (CLAIM, EXPIRE, SETTLE) and
ran, but whose reply never reached the node (a socket timeout on a loaded Redis, a
connection cut after the script ran, a primary that died after running it): the node
sends it again, and Redis answers with what the first run took instead of taking more.
Before, the first run's messages stayed in the node's deliveries, known to nobody, until
the node itself ended: on a live node, messages that were neither delivered nor lost.

Each test runs one node's queue machinery on a real redis-server (``lifecycle_world``)
whose client loses the reply of the first runs of one script (the script ran).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from holdfast.broker.consumers import Consumer, FlowLimits
from holdfast.broker.lifecycle import State
from holdfast.broker.redis import client as client_module
from holdfast.broker.redis.client import RedisClient, parse_redis_spec
from holdfast.broker.redis.keys import QueueKeys, lease_key
from holdfast.broker.redis.policy_scripts import EXPIRE, SETTLE
from holdfast.broker.redis.script import Script
from holdfast.broker.redis.scripts import CLAIM, CONFIRM, REQUEUE, UNCLAIM
from holdfast.broker.store import StoreError
from holdfast.proto.policy import REASON_DELIVERY_LIMIT, REASON_EXPIRED
from holdfast.sdk import QueueOptions, Session
from tests.redis.fencing_kit import Deliveries, redis_url_through
from tests.redis.lifecycle_world import RedisWorld, Seen, Sink, in_world
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.toxics import toxic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


class Faulty:
    """Wraps the node client's ``send_script`` (every script call's one way to Redis):
    the next ``times`` calls of ``script`` fail.
    ``LoseReplies``: they run in Redis, then raise the timeout redis-py raises when a
    reply does not come back. ``Refuse``: Redis refuses them at once (they do not run)."""

    ran_first = True

    def __init__(self, world: RedisWorld, script: Script, times: int = 1) -> None:
        client = world.client
        self._real = client.send_script
        self._script = {client._registered(script).sha, script.lua}  # EVALSHA or EVAL
        self.left = times
        self.calls = 0
        client.send_script = self._send_script  # type: ignore[method-assign]

    @property
    def lost(self) -> int:
        """How many calls failed."""
        return self.calls

    async def _send_script(
        self, command: str, script: str, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        if script not in self._script or self.left <= 0:
            return await self._real(command, script, keys, args)
        if self.ran_first:
            # Run first: a NOSCRIPT (the script not loaded yet) did not run, so it
            # must not count as a call whose reply was lost.
            await self._real(command, script, keys, args)
        self.left -= 1
        self.calls += 1
        if not self.ran_first:
            raise ResponseError("OOM command not allowed when used memory > 'maxmemory'")
        raise RedisTimeoutError("Timeout reading from socket (the test lost the reply)")


class LoseReplies(Faulty):
    """The calls run, and their replies are lost."""


class Refuse(Faulty):
    """The calls are refused before they run."""

    ran_first = False


async def put(world: RedisWorld, count: int, first: int = 0) -> list[bytes]:
    guids = [bytes([7, i]) * 8 for i in range(first, first + count)]
    for guid in guids:
        await world.put(guid, None)
    return guids


async def out(world: RedisWorld) -> set[bytes]:
    """What Redis holds as node ``a``'s deliveries of the queue."""
    return set(await world.client.redis.zrange(world.keys.out(world.a.node_id), 0, -1))


def run(redis_url: str, body: Callable[[RedisWorld], Awaitable[None]]) -> None:
    in_world(redis_url, body)


def test_a_claim_whose_reply_was_lost_delivers_what_it_took_and_strands_nothing(
    redis_url: str,
) -> None:
    async def walk(world: RedisWorld) -> None:
        guids = await put(world, 5)
        lose = LoseReplies(world, CLAIM)
        sink = Sink()
        consumer = Consumer(2, sink, FlowLimits(max_messages=10))
        world.queue.attach(consumer)
        await world.settle()
        assert lose.lost == 1
        # Every message reached the consumer, once, counted once.
        assert sorted(consumer.unconfirmed) == sorted(guids)
        assert sink.counts == dict.fromkeys(guids, 1)
        # And the node's deliveries in Redis are exactly what its consumer holds.
        assert await out(world) == set(guids)
        assert await world.client.redis.llen(world.keys.ready) == 0
        for guid in guids:
            assert world.queue.confirm(consumer, guid)
        await world.settle()
        assert await out(world) == set()
        stats = await world.client.redis.hgetall(world.keys.stats)
        assert int(stats.get(b"redelivered", 0)) == 0

    run(redis_url, walk)


def test_a_claim_that_failed_for_the_whole_retry_window_is_taken_up_by_the_next(
    redis_url: str,
) -> None:
    """The node gave up on a claim (its reply lost on every try within the retry window):
    the next claim of the queue is sent under the same token, so it hands out what the
    lost one took before it takes anything new."""

    async def walk(world: RedisWorld) -> None:
        world.client.retry_window = 0.3
        guids = await put(world, 3)
        lose = LoseReplies(world, CLAIM, times=1_000)
        sink = Sink()
        consumer = Consumer(2, sink, FlowLimits(max_messages=10))
        world.queue.attach(consumer)
        await world.settle()
        assert lose.lost >= 2 and not consumer.unconfirmed
        assert await out(world) == set(guids)  # taken, in Redis; the node knows nothing
        lose.left = 0
        more = await put(world, 1, first=3)
        world.queue.deliver()
        await world.settle()
        assert list(sink.counts) == guids + more  # what the lost claim took comes first
        assert sink.counts == dict.fromkeys(guids + more, 1)
        assert await out(world) == set(guids + more)

    run(redis_url, walk)


def test_a_claim_that_fails_at_once_while_one_is_lost_is_not_tried_again_at_once(
    redis_url: str,
) -> None:
    """A lost claim's token waits for the next claim; if that one fails at once (Redis
    refuses it: out of memory, say), the queue waits for the node's poll instead of
    claiming again in a loop."""

    async def walk(world: RedisWorld) -> None:
        world.client.retry_window = 0.2
        await put(world, 2)
        lose = LoseReplies(world, CLAIM, times=1_000)
        consumer = Consumer(2, Sink(), FlowLimits(max_messages=10))
        world.queue.attach(consumer)
        await world.settle()  # lost for the whole window: its token waits
        refused = Refuse(world, CLAIM, times=50)
        lose.left = 0
        world.queue.deliver()
        await world.settle()
        assert refused.calls == 1, f"claimed {refused.calls} times in a row"
        refused.left = 0
        world.queue.deliver()
        await world.settle()
        assert len(consumer.unconfirmed) == 2

    run(redis_url, walk)


def test_a_give_back_redis_refused_is_tried_again_and_nothing_is_claimed_past_it(
    redis_url: str,
) -> None:
    """A consumer leaves holding a message and Redis refuses its REQUEUE; a claim then
    finds nobody to hand its message to and Redis refuses that UNCLAIM too. Both stay
    owed (the messages sit in the node's deliveries, held by no consumer), the queue
    claims nothing past them, and the sweep gives them back once Redis takes it."""

    async def walk(world: RedisWorld) -> None:
        first, second = await put(world, 2)
        await world.deliver()
        assert await world.seen(first) == Seen(State.HELD, 1)
        requeues = Refuse(world, REQUEUE, times=1_000)
        await world.session_lost()
        assert requeues.calls == 1 and await world.seen(first) == Seen(State.HELD, 1)
        # A newcomer's claim waits for the give-back: nothing overtakes it.
        unclaims = Refuse(world, UNCLAIM, times=1_000)
        sink = Sink()
        newcomer = Consumer(3, sink, FlowLimits(max_messages=5))
        world.queue.attach(newcomer)
        await world.settle()
        assert not newcomer.unconfirmed and not sink.counts
        requeues.left = unclaims.left = 0
        world.clock.ms += 1000
        await world.sweep()  # pays what is owed, and wakes the queue
        world.queue.deliver()
        await world.settle()
        assert list(sink.counts) == [first, second]
        assert sink.counts == {first: 2, second: 1}

    run(redis_url, walk)


async def refused_then_swept(
    world: RedisWorld, script: Script, step: Callable[[], object], guid: bytes
) -> None:
    """``step`` makes the node run ``script``, which Redis refuses: ``guid`` stays held by
    the node in Redis. Then Redis takes it, and the node's next full sweep pays the debt."""
    refused = Refuse(world, script, times=1_000)
    step()
    await world.settle()
    assert refused.calls == 1 and await world.seen(guid) == Seen(State.HELD, 1)
    refused.left = 0
    world.clock.ms += 1000
    await world.sweep()


def test_an_unclaim_redis_refused_is_tried_again_with_its_count_given_back(
    redis_url: str,
) -> None:
    async def walk(world: RedisWorld) -> None:
        [guid] = await put(world, 1)

        def claim_then_leave() -> None:
            world.queue.attach(world.consumer)  # the claim is on its way
            world.queue.detach(world.consumer)  # ...and its consumer goes

        await refused_then_swept(world, UNCLAIM, claim_then_leave, guid)
        # Back as never claimed: ready, its delivery uncounted.
        assert await world.seen(guid) == Seen(State.READY, 0)

    run(redis_url, walk)


def test_a_confirm_redis_refused_is_written_by_the_sweep_and_not_delivered_again(
    redis_url: str,
) -> None:
    async def walk(world: RedisWorld) -> None:
        [guid] = await put(world, 1)
        await world.deliver()
        step = lambda: world.queue.confirm(world.consumer, guid)  # noqa: E731
        await refused_then_swept(world, CONFIRM, step, guid)
        assert (await world.seen(guid)).state is None  # gone: confirmed, not kept

    run(redis_url, walk)


def test_an_expiry_whose_reply_was_lost_buries_what_it_took(redis_url: str) -> None:
    async def walk(world: RedisWorld) -> None:
        await world.set_policy(None, 2.0)
        guids = await put(world, 3)
        world.clock.ms += 3000
        lose = LoseReplies(world, EXPIRE)
        await world.sweep()
        assert lose.lost == 1
        for guid in guids:
            assert await world.seen(guid) == Seen(State.DEAD, 0, REASON_EXPIRED)
        assert await out(world) == set()

    run(redis_url, walk)


def test_a_settle_whose_reply_was_lost_buries_what_it_took(redis_url: str) -> None:
    """A dead node's deliveries come back to the head; the survivor settles them (the
    spent ones are buried) and loses that reply."""

    async def walk(world: RedisWorld) -> None:
        await world.set_policy(1, None)
        [guid] = await put(world, 1)
        await world.deliver()
        assert await world.seen(guid) == Seen(State.HELD, 1)
        lose = LoseReplies(world, SETTLE)
        await world.client.redis.delete(lease_key(world.a.node_id))
        await world.survivor.reap()
        await world.settle()
        assert lose.lost == 1
        assert await world.seen(guid) == Seen(State.DEAD, 1, REASON_DELIVERY_LIMIT)
        survivor_out = QueueKeys(world.uri).out(world.b.node_id)
        assert await world.client.redis.zcard(survivor_out) == 0
        await world.client.redis.set(lease_key(world.a.node_id), 1)

    run(redis_url, walk)


def test_a_command_whose_reply_times_out_is_sent_once_per_retry_of_the_stores_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's asyncio client re-sends a timed-out command ten times by default,
    silently (a script that ran each time, and an outage hidden from the retry window).
    The store's client sends it once per retry of its own, which it logs and bounds."""
    monkeypatch.setattr(client_module, "SOCKET_TIMEOUT", 0.2)
    extra = ("--enable-debug-command", "yes")
    with RedisServer(tmp_path, aof=False, extra=extra) as server:

        async def slow_call() -> None:
            client = RedisClient(parse_redis_spec(server.url), retry_window=0.0)
            try:
                with pytest.raises(StoreError, match="Timeout"):
                    await client.call(
                        "DEBUG SLEEP", lambda: client.redis.execute_command("DEBUG", "SLEEP", 0.4)
                    )
            finally:
                await client.close()

        asyncio.run(slow_call())
        plain = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=10)
        try:
            stats = plain.info("commandstats")  # answered once the sleeps are over
        finally:
            plain.close()
    assert stats["cmdstat_debug"]["calls"] == 1


@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_a_broker_whose_claim_replies_are_cut_delivers_every_message_once_when_they_pass(
    tmp_path: Path, toxic_link: Callable[[str, str], Any], via: str
) -> None:
    """End to end: a broker node's link to Redis cuts every connection after 50 kB of
    replies (``limit_data``), so each claim of 1 kB messages runs in Redis and loses its
    reply, again and again, while the lease keeper's small replies pass. Meanwhile the
    consumer's session leaves and another opens the queue: the node keeps its view of
    the queue until the lost claim is settled, so the newcomer's claims queue up behind
    it instead of replacing its record. Once replies pass again, every message is
    delivered, once, and none is left held in Redis. Before, each lost claim's messages
    stayed in the node's deliveries until it ended. The clients reach the broker
    directly, or through a proxy."""
    uri = "hf://lost/replies"
    with RedisServer(tmp_path / "redis", aof=False) as server:
        link = toxic_link("redis", server.address)
        with (
            BrokerProcess(["--store", redis_url_through(link)]) as broker,
            contextlib.ExitStack() as stack,
        ):
            address = broker.address
            if via == "proxy":
                address = stack.enter_context(ProxyProcess(["--upstream", address])).address
            with Session(address, options=FAST) as producer:
                queue = producer.open_queue(uri, write=True)
                guids = [queue.post(b"%04d" % i + bytes(1020)) for i in range(300)]
                assert producer.flush(timeout=30)
            got = Deliveries()
            with (
                toxic(link, "limit_data", stream="downstream", bytes=50_000),
                Session(address, options=FAST) as consumer,
            ):
                consumer.open_queue(
                    uri,
                    read=True,
                    on_message=got,
                    options=QueueOptions(max_unconfirmed_messages=1000),
                )
                wait_until(lambda: broker.count("unreachable") >= 1, 30, "a claim's reply cut")
                assert got.count() == 0
            with Session(address, options=FAST) as consumer:
                consumer.open_queue(uri, read=True, on_message=got)
                wait_until(lambda: got.count() >= len(guids), 30, "every message")
                wait_until(lambda: not _held(server), 15, "the deliveries confirmed in Redis")
    assert Counter(got.guids()) == Counter(dict.fromkeys(guids, 1))


def _held(server: RedisServer) -> int:
    """Messages any node holds as delivered and unconfirmed, in Redis."""
    plain = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        return sum(int(plain.zcard(key)) for key in plain.scan_iter(match="hf:*:out:*"))
    finally:
        plain.close()

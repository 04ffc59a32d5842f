"""Pieces of the Redis store on their own: a sweep pass over open queues is bounded;
store addresses parse."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import pytest

from holdfast.broker.redis.client import RedisSpec, parse_redis_spec
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.owed import OwedWrites
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.scripts import confirm
from holdfast.broker.redis.spec import redact
from holdfast.broker.redis.sweep import FULL_BATCH, Sweeper
from holdfast.broker.redis.takes import TakeTokens
from holdfast.broker.store import StoreError


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
        ("redis://bob@h:1", "credentials are USER:PASSWORD@"),
        ("redis://:hunter2@h", "expected HOST:PORT"),
    ):
        with pytest.raises(ValueError, match=why) as refused:
            parse_redis_spec(bad)
        assert "hunter2" not in str(refused.value)


def test_credentials_in_a_store_address_are_kept_and_never_shown() -> None:
    """The password was parsed and dropped: a Redis with requirepass looked like an
    outage for 30 s. It is kept (percent-decoded, for every form) and never shown."""
    plain = parse_redis_spec("redis://:p%40ss/w,d@h:1/3")
    assert (plain.username, plain.password, plain.nodes, plain.db) == (
        None, "p@ss/w,d", (("h", 1),), 3,
    )  # fmt: skip
    sentinel = parse_redis_spec("redis+sentinel://bob:hunter2@a:1,b:2/orders/2")
    assert (sentinel.username, sentinel.password, sentinel.service) == ("bob", "hunter2", "orders")
    cluster = parse_redis_spec("redis+cluster://bob:hunter2@a:1,b:2")
    assert (cluster.username, cluster.password, len(cluster.nodes)) == ("bob", "hunter2", 2)
    assert "hunter2" not in repr(sentinel) + repr(cluster)
    assert redact("rediss://bob:hunter2@h:1/0") == "rediss://***@h:1/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"


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


class _ClaimRacingClient:
    """A Redis client stand-in whose CLAIM ran at sequence ``claimed``, while the reply
    of a later script (``later``, a confirm on another connection) reached the node
    first; it records the scripts it ran."""

    def __init__(self, registry: Any, uri: str, claimed: int, later: int) -> None:
        self._registry, self._uri = registry, uri
        self._claimed, self._later = claimed, later
        self.ran: list[str] = []

    async def run(self, call: Any) -> list[Any]:
        self.ran.append(call.script.name)
        if call.script.name != "CLAIM":
            return []
        self._registry.seqs.saw(self._uri, self._later)  # its reply overtook the claim's
        return [b"g" * 16, b"payload", b"7|1000|{}", 1, b"", self._claimed]


def _claiming_queue(uri: str, claimed: int, later: int, seen: int) -> tuple[Any, Any, list[str]]:
    """A Redis queue with no consumers whose registry saw ``seen``, a client that
    races a CLAIM, and the list of went-back checks the claim asks for."""
    import asyncio

    from holdfast.broker.redis.losses import SeqBook
    from holdfast.broker.redis.queues import RedisQueue
    from holdfast.proto.policy import QueuePolicy

    checks: list[str] = []

    async def on_went_back() -> None:
        checks.append(uri)

    async def remember_queue(_: str) -> None:
        await asyncio.sleep(0)

    registry = SimpleNamespace(
        seqs=SeqBook(lambda: 100.0),
        repairing=set(),
        node_id="n1",
        policies=SimpleNamespace(effective=lambda _: QueuePolicy()),
        now_ms=lambda: 5000,
        lease=lambda _: "lease",
        remember_queue=remember_queue,
        on_went_back=on_went_back,
        wake=lambda _: None,
        may_deliver=lambda: True,
        takes=TakeTokens(),
        release=lambda _: None,
        owed=OwedWrites(),
    )
    registry.seqs.saw(uri, seen)
    registry.client = _ClaimRacingClient(registry, uri, claimed, later)
    return RedisQueue(uri, cast(RedisRegistry, registry)), registry.client, checks


def test_a_claim_overtaken_by_a_later_scripts_reply_is_no_rollback() -> None:
    """The node saw 10 and claims (Redis runs it as 11); a confirm that ran after it
    (12) replies first. The claim moved the sequence past all the node saw when it sent
    it: Redis did not go back, and no loss check runs. Before, the claim compared 11
    with 12, took the message back and ran the check, and a claim started meanwhile
    delivered the message behind it first (the lifecycle machine on Redis, in CI)."""
    import asyncio

    uri = "hf://claim/race"
    queue, client, checks = _claiming_queue(uri, claimed=11, later=12, seen=10)
    assert asyncio.run(queue._claim_and_hand_out(1)) is True  # handed to nobody: look again
    assert checks == []
    assert client.ran == ["CLAIM", "UNCLAIM"]  # no consumer: given back as never claimed
    # A claim at or below what the node saw before sending it: Redis went back.
    queue, client, checks = _claiming_queue(uri, claimed=9, later=12, seen=10)
    asyncio.run(queue._claim_and_hand_out(1))
    assert checks == [uri]


def test_a_claim_holds_the_queue_until_its_give_back_is_done() -> None:
    """A consumer leaves while a claim is on its way and another attaches while the
    UNCLAIM of the claimed message is: the new consumer's claim starts only once the
    message is back at the head, or it would take the one behind it first."""
    import asyncio

    uri = "hf://claim/hold"
    queue, client, _ = _claiming_queue(uri, claimed=11, later=11, seen=10)
    newcomer = SimpleNamespace(has_room=lambda: True, limits=SimpleNamespace(max_messages=1))
    newcomer.unconfirmed = {}
    real_unclaim = queue._unclaim

    async def unclaim(messages: Any) -> None:
        queue._consumers.append(newcomer)
        queue.deliver()  # the attach, while the give-back is on its way
        client.ran.append("deliver")
        await real_unclaim(messages)

    def spawn(work: Any) -> None:
        client.ran.append("spawn claim")
        work.close()

    queue._unclaim = unclaim
    queue._registry.spawn = spawn
    queue._claiming = True
    asyncio.run(queue._claim(1))
    assert client.ran == ["CLAIM", "deliver", "UNCLAIM", "spawn claim"]


def test_a_pass_over_owed_writes_ends_at_the_first_that_fails_and_keeps_their_order() -> None:
    """Each try of an owed write can take the whole retry window, and the sweep waits for
    the pass: the first failure ends it. What failed stays owed ahead of what failed
    while it was tried; a debt of an earlier incarnation of the node is dropped (the
    reaper reclaims its deliveries); an owed confirm holds no claim back."""
    ran: list[tuple[str, list[Any]]] = []
    owed = OwedWrites()
    refuse = [True]

    class Client:
        async def run(self, call: Any) -> None:
            ran.append((call.script.name, list(call.args)))
            if refuse[0]:
                if call.script.name == "REQUEUE":
                    owed.add("hf://u/a", "n1", requeues=[b"late"])  # failed meanwhile
                raise StoreError(f"redis store: {call.script.name} failed for 30 s")

    woken: list[str] = []
    client = Client()

    async def remove(uri: str, guids: list[bytes]) -> None:  # RedisRegistry.remove's CONFIRM
        await client.run(confirm(QueueKeys(uri), node="n1", lease="lease", guids=guids))

    registry = SimpleNamespace(
        client=client, node_id="n1", lease=lambda _: "lease", wake=woken.append, remove=remove
    )
    owed.add("hf://u/old", "n0", requeues=[b"x"])
    owed.add("hf://u/a", "n1", requeues=[b"g1", b"g2"])
    owed.add("hf://u/b", "n1", requeues=[b"h"])
    owed.confirm("hf://u/c", "n1", [b"c1"])
    assert asyncio.run(owed.pay(cast(RedisRegistry, registry))) == 0
    assert ran == [("CONFIRM", [b"c1"])]  # confirms first; the pass ends there
    assert not owed.owes("hf://u/c")  # a confirm owed holds no claim back
    ran.clear()
    owed.confirm("hf://u/c", "n0", [b"c0"])  # an earlier incarnation's: dropped
    assert asyncio.run(owed.pay(cast(RedisRegistry, registry))) == 0
    assert ran == [("REQUEUE", [b"g1", b"g2"])]  # u/old dropped, u/b not tried
    assert not owed.owes("hf://u/old") and owed.owes("hf://u/b") and len(owed) == 4
    refuse[0] = False
    ran.clear()
    assert asyncio.run(owed.pay(cast(RedisRegistry, registry))) == 4
    assert ran == [("REQUEUE", [b"h"]), ("REQUEUE", [b"g1", b"g2", b"late"])]
    assert woken == ["hf://u/b", "hf://u/a"] and len(owed) == 0


def test_the_node_metrics_show_the_messages_it_owes_redis() -> None:
    """``holdfast_broker_redis_owed_messages``: what the sweep still has to write."""
    from holdfast.broker.redis.metrics import RedisNodeCollector

    owed = OwedWrites()
    keeper = SimpleNamespace(lapses=0, last_renewal_seconds=0.001)
    life = SimpleNamespace(
        keeper=keeper, revoked=0, reclaimed=0, data_losses=0, registry=SimpleNamespace(owed=owed)
    )
    collector = RedisNodeCollector(cast(Any, life))

    def owed_now() -> float:
        [family] = [m for m in collector.collect() if m.name.endswith("owed_messages")]
        return float(family.samples[0].value)

    assert owed_now() == 0
    owed.add("hf://u/a", "n1", requeues=[b"g1", b"g2"])
    owed.confirm("hf://u/b", "n1", [b"c1"])
    assert owed_now() == 3


def test_a_second_loss_check_of_a_queue_the_first_adopted_finds_nothing() -> None:
    """Two loss checks at once (every beat's, and the lease keeper's): the first adopts
    what Redis holds; the second, which read the same value against what the node had
    seen before, finds nothing more (it raised StopIteration in the sweep before)."""
    from holdfast.broker.redis.losses import SeqBook

    clock = [100.0]
    book = SeqBook(lambda: clock[0])
    book.saw("hf://d/q", 5)
    clock[0] = 101.0
    book.saw("hf://d/q", 9)
    assert book.went_back("hf://d/q", 4, 9) == 100.0
    assert book.went_back("hf://d/q", 4, 9) is None

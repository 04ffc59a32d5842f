"""Redis scripts whose rules the single-node tests do not reach, run on a redis-server
directly: ``PROMOTE`` (only with ``min_replicas``), ``COUNTS`` (the consumers of other
nodes), ``RECLAIM``'s bookkeeping of a dead node, and the write sequence of scripts
that change nothing. Each is held to what its callers rely on (``durable``,
``refresh``, ``reaper``, ``losses``)."""

from __future__ import annotations

import pytest
import redis

from holdfast.broker.redis.admin_scripts import DELETE, PURGE
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.losses import DELETED_SEQ_TTL
from holdfast.broker.redis.move_scripts import ADD, GONE, LEAVE, LEAVING, STAY, TAKE
from holdfast.broker.redis.policy_scripts import DELAY, EXPIRE, REPAIR, SETTLE
from holdfast.broker.redis.put_scripts import PROMOTE, PUT, PUT_OUTCOMES
from holdfast.broker.redis.scripts import CONFIRM, COUNTS, RECLAIM, REQUEUE, UNCLAIM
from tests.redis.scripts_kit import queue, run

pytestmark = pytest.mark.timeout(30)


def test_promote_makes_the_guid_and_every_one_stored_before_it_ready_in_order(
    db: redis.Redis,
) -> None:
    keys = queue()
    db.rpush(keys.unsynced, "a", "b", "c", "d")
    promote = [keys.unsynced, keys.ready]
    assert run(db, PROMOTE, promote, ["b"]) == 2
    assert db.lrange(keys.ready, 0, -1) == [b"a", b"b"]
    assert db.lrange(keys.unsynced, 0, -1) == [b"c", b"d"]
    # A GUID promoted already (or never held back) moves nothing.
    assert run(db, PROMOTE, promote, ["b"]) == 0
    assert run(db, PROMOTE, promote, ["d"]) == 2
    assert db.lrange(keys.ready, 0, -1) == [b"a", b"b", b"c", b"d"]
    assert db.llen(keys.unsynced) == 0


def test_counts_reads_depth_bytes_unsynced_and_the_consumers_of_other_nodes(
    db: redis.Redis,
) -> None:
    busy, empty = queue(), queue()
    db.rpush(busy.ready, "a", "b")
    db.zadd(busy.delayed, {"c": 1})
    db.set(busy.bytes, 7)
    db.rpush(busy.unsynced, "d")
    db.hset(busy.consumers, mapping={"me": 2, "n1": 3, "n2": 1})

    def five(keys: QueueKeys) -> list[str]:
        return [keys.ready, keys.delayed, keys.bytes, keys.unsynced, keys.consumers]

    # Per queue: ready + delayed, bytes, unsynced, consumers on nodes other than "me".
    assert run(db, COUNTS, five(busy) + five(empty), ["me"]) == [3, 7, 1, 4, 0, 0, 0, 0]


def test_reclaim_puts_a_dead_nodes_deliveries_back_first_and_forgets_its_handles(
    db: redis.Redis,
) -> None:
    keys = queue()
    db.rpush(keys.ready, "x")
    db.zadd(keys.out("dead"), {"g1": 1, "g2": 2})
    db.hset(keys.consumers, mapping={"dead": 1, "live": 2})
    db.hset(keys.handles, mapping={"dead": 1, "live": 1})
    db.rpush(keys.took("dead", "claim"), "t7", "g2", "")
    db.rpush(keys.took("live", "claim"), "t3", "x", "")
    reclaim = [keys.ready, keys.out("dead"), keys.consumers, keys.handles]
    assert run(db, RECLAIM, [*reclaim, keys.took("dead", "claim")], ["dead"]) == 2
    # Oldest delivery first, ahead of what was ready.
    assert db.lrange(keys.ready, 0, -1) == [b"g1", b"g2", b"x"]
    assert not db.exists(keys.out("dead"))
    # Its consumers and open handles are gone with it (a DELETE is no longer refused).
    assert db.hgetall(keys.consumers) == {b"live": b"2"}
    assert db.hgetall(keys.handles) == {b"live": b"1"}
    # So is its record of what it took; another node's stays.
    assert not db.exists(keys.took("dead", "claim")) and db.exists(keys.took("live", "claim"))


def test_a_put_or_a_confirm_that_changes_nothing_keeps_the_write_sequence(
    db: redis.Redis,
) -> None:
    """The sequence moves by one per script that changed the queue (``losses``): a PUT
    that stored nothing (too old) and a confirm of nothing held return it unmoved."""
    keys = queue()
    db.set(keys.seq, 5)
    put_keys = [keys.ready, keys.body, keys.meta, keys.bytes, keys.stats, keys.pickup]
    put_keys += [keys.unsynced, keys.seq, keys.consumers]
    header = [keys.prefix + "g:", "60000", "1000", "1700000000000", "0", "0", "0"]
    too_old = ["g1", "digest", "1001", "{}", "payload", "0"]
    assert run(db, PUT, put_keys, header + too_old) == [PUT_OUTCOMES["TOO_OLD"], 0, 5]
    # A non-lease key in the lease's place: no fence (as on a Cluster).
    confirm_keys = [keys.body, keys.meta, keys.count, keys.out("n"), keys.bytes, keys.pickup]
    assert run(db, CONFIRM, [*confirm_keys, keys.ready, keys.seq], ["g1"]) == [0, 5]


def test_requeue_and_unclaim_put_back_in_order_and_answer_how_many(db: redis.Redis) -> None:
    """Both answer the number of messages they gave back (only the node's own
    deliveries: a GUID it does not hold is skipped)."""
    keys = queue()
    out = keys.out("n")
    db.zadd(out, {"a": 1, "b": 2, "c": 3})
    db.hset(keys.count, mapping={"a": 1, "b": 1, "c": 1})
    # A non-lease key in the lease's place: no fence (as on a Cluster).
    assert run(db, REQUEUE, [keys.ready, out, keys.seq], ["a", "b", "gone"]) == 2
    assert db.lrange(keys.ready, 0, -1) == [b"a", b"b"]
    unclaim = [keys.ready, keys.count, out, keys.pickup, keys.stats, keys.seq]
    assert run(db, UNCLAIM, unclaim, ["gone", "0", "c", "0"]) == 1
    assert db.lrange(keys.ready, 0, -1) == [b"c", b"a", b"b"]


def test_the_move_scripts_answer_how_many_they_moved(db: redis.Redis) -> None:
    """DELAY, LEAVE and STAY each answer the number of messages they acted on, GONE
    the GUIDs, skipping one not where they look for it (``policy_scripts``); ADD answers
    a status and a GUID a move (``move_scripts``)."""
    keys, target = queue(), queue()
    out = keys.out("n")
    db.zadd(out, {"a": 1, "b": 2, "c": 3})
    for guid in ("a", "b", "c"):
        db.hset(keys.body, guid, "p")
        db.hset(keys.meta, guid, "d|1|{}")
    db.set(keys.bytes, 3)
    # A non-lease key in the lease's place: no fence (as on a Cluster).
    assert run(db, DELAY, [out, keys.delayed, keys.seq], ["99", "a", "gone"]) == 1
    leave = [keys.leaving, keys.seq]
    assert run(db, LEAVE, [out, *leave], ["5", "b", "x|t", "c", "x|t", "gone", "x|t"]) == 2
    assert db.hget(keys.leaving, "c") == b"5|x|t"
    assert run(db, STAY, [keys.leaving, keys.ready], ["c", "gone"]) == 1
    assert db.lrange(keys.ready, 0, -1) == [b"c"]
    gone = [keys.body, keys.meta, keys.count, keys.leaving, keys.bytes, keys.pickup, keys.stats]
    assert run(db, GONE, gone, ["b", "gone"]) == [b"b"]
    assert not db.hexists(keys.body, "b")
    assert run(db, GONE, gone, ["b"]) == []  # finished already: not counted again
    assert db.hgetall(keys.stats) == {b"dead:x": b"1"}
    add = [target.ready, target.body, target.meta, target.count, target.bytes, target.pickup]
    marker = [target.prefix + "mv:", "60000"]

    def move(guid: str, move_id: str, mode: str = "r") -> list[str]:
        # guid, move id, meta, payload, mode, origin URI, renamed meta, pickup deadline
        # (move_scripts.ADD)
        return [guid, move_id, "d|1|{}", "p", mode, "hf://o/q", "d|1|{renamed}", "0"]

    args = [*marker, *move("b", "m1"), *move("e", "m2")]
    assert run(db, ADD, add, args) == [1, b"b", 1, b"e"]
    # The same moves again add nothing: each move adds one copy.
    assert run(db, ADD, add, args) == [0, b"b", 0, b"e"]
    assert db.lrange(target.ready, 0, -1) == [b"b", b"e"]
    assert db.get(target.bytes) == b"2"
    # Once "b" left the target, another move of it (a new move id) adds it again.
    db.hdel(target.body, "b")
    assert run(db, ADD, add, [*marker, *move("b", "m3")]) == [1, b"b"]
    # A GUID the target holds: a replay ('k') is left out; a dead letter ('r') is added
    # under a derived GUID with the renamed meta, never dropped.
    assert run(db, ADD, add, [*marker, *move("e", "m4", "k")]) == [3, b"e"]
    answer = run(db, ADD, add, [*marker, *move("e", "m5")])
    assert isinstance(answer, list)
    status, renamed = answer
    assert status == 2 and renamed != b"e" and len(renamed) == 16
    assert db.hget(target.meta, renamed) == b"d|1|{renamed}"
    assert db.lrange(target.ready, 0, -1) == [b"b", b"e", b"b", renamed]
    assert db.zcard(target.pickup) == 0
    # A copy with a pickup deadline (a dead-letter notice) is swept at it, renamed or not.
    notice = [*marker, *move("e", "m6")[:-1], "77", *move("n", "m7")[:-1], "88"]
    answer = run(db, ADD, add, notice)
    assert isinstance(answer, list)
    status, again, added, _ = answer
    assert (status, added) == (2, 1)
    assert db.zrange(target.pickup, 0, -1, withscores=True) == [(again, 77.0), (b"n", 88.0)]


def test_expire_takes_at_most_a_batch_and_stops_at_a_fresh_never_delivered_message(
    db: redis.Redis,
) -> None:
    """EXPIRE (the sweep): ready messages accepted at or before the cutoff, at most
    ``most`` a call; it steps over delivered ones within the TTL, stops at the first
    never-delivered one within it, and drops a ready GUID whose message is gone."""
    keys = queue()
    accepted = {"old1": 1000, "again": 5000, "old2": 1500, "fresh": 5000, "old3": 1000}
    db.rpush(keys.ready, "stale", *accepted)
    for guid, ms in accepted.items():
        db.hset(keys.body, guid, "p")
        db.hset(keys.meta, guid, f"d|{ms}|{{}}")
    db.hset(keys.count, "again", 1)
    # A non-lease key in the lease's place: no fence (as on a Cluster).
    expire = [*keys.message_keys, keys.out("n"), keys.pickup, keys.seq, keys.took("n", "e")]

    def taken(most: int) -> list[bytes]:
        reply = run(db, EXPIRE, expire, ["9000", "2000", str(most), f"take-{most}"])
        assert isinstance(reply, list)
        return reply[0::4]

    assert taken(1) == [b"old1"]
    assert db.lrange(keys.ready, 0, -1) == [b"again", b"old2", b"fresh", b"old3"]
    assert taken(10) == [b"old2"]
    assert db.lrange(keys.ready, 0, -1) == [b"again", b"fresh", b"old3"]


def test_expire_takes_a_never_delivered_message_past_its_pickup_deadline_only(
    db: redis.Redis,
) -> None:
    keys = queue()
    for guid in ("missed", "delivered", "early"):
        db.hset(keys.body, guid, "p")
        db.hset(keys.meta, guid, "d|1000|{}")
    db.rpush(keys.ready, "missed", "early")
    db.hset(keys.count, "delivered", 1)
    db.zadd(keys.pickup, {"missed": 100, "delivered": 100, "early": 300})
    expire = [*keys.message_keys, keys.out("n"), keys.pickup, keys.seq, keys.took("n", "e")]
    reply = run(db, EXPIRE, expire, ["200", "0", "10", "t"])
    assert isinstance(reply, list) and reply[0::4] == [b"missed"]
    assert db.lrange(keys.ready, 0, -1) == [b"early"]
    # The due deadlines are gone, taken or not; a later one stays.
    assert db.zrange(keys.pickup, 0, -1) == [b"early"]


def test_settle_buries_only_the_released_messages_spent_or_at_their_ttl(
    db: redis.Redis,
) -> None:
    """SETTLE (``lifecycle.release`` on the first n ready messages): spent ones with
    ``delivery-limit``, ones accepted at or before the cutoff ``expired``, the rest
    and the messages behind the first n stay ready."""
    keys = queue()
    accepted = {"spent": 5000, "at-ttl": 2000, "young": 2001, "behind": 1000}
    db.rpush(keys.ready, *accepted)
    for guid, ms in accepted.items():
        db.hset(keys.body, guid, "p")
        db.hset(keys.meta, guid, f"d|{ms}|{{}}")
    db.hset(keys.count, mapping={"spent": 1, "young": 0})
    settle = [keys.ready, keys.body, keys.meta, keys.count, keys.out("n"), keys.pickup]
    # A non-lease key in the lease's place: no fence (as on a Cluster).
    took = keys.took("n", "s")
    reply = run(db, SETTLE, [*settle, keys.seq, took], ["9000", "2000", "1", "3", "t1"])
    assert isinstance(reply, list)
    assert list(zip(reply[0::5], reply[4::5], strict=True)) == [
        (b"spent", b"delivery-limit"),
        (b"at-ttl", b"expired"),
    ]
    assert db.lrange(keys.ready, 0, -1) == [b"young", b"behind"]
    # Without a limit or a TTL nothing is buried.
    assert run(db, SETTLE, [*settle, keys.seq, took], ["9000", "0", "0", "2", "t2"]) == []


def test_leaving_lists_the_moves_begun_by_then_with_their_reason_and_target(
    db: redis.Redis,
) -> None:
    keys = queue()
    db.hset(keys.body, mapping={"a": "p", "b": "p"})
    db.hset(keys.meta, mapping={"a": "d|1|{}", "b": "d|1|{}"})
    for guid, since in (("a", 100), ("b", 101), ("c", 99)):
        db.hset(keys.leaving, guid, f"{since}|expired|hf://t")
    reply = run(db, LEAVING, [keys.leaving, keys.body, keys.meta, keys.count], ["100"])
    assert isinstance(reply, list)
    assert (reply[0], reply[4]) == (b"a", b"expired|hf://t")
    assert len(reply) == 5
    # "c" has no message left (its move finished): its entry goes.
    assert sorted(db.hkeys(keys.leaving)) == [b"a", b"b"]


def test_repair_raises_counts_to_what_the_node_saw_and_removes_what_it_saw_confirmed(
    db: redis.Redis,
) -> None:
    """REPAIR after Redis went back in time (``losscheck``): a message still here gets
    at least the count the node saw (counts never go back), and one the node saw
    confirmed is removed again from every key; GUIDs not here are skipped."""
    keys = queue()
    for guid in ("a", "b", "c", "d"):
        db.hset(keys.body, guid, "p")
        db.hset(keys.meta, guid, "d|1|{}")
    db.set(keys.bytes, 4)
    db.hset(keys.count, mapping={"a": 1, "b": 3, "c": 1, "d": 2})
    db.rpush(keys.ready, "c", "b")
    db.zadd(keys.pickup, {"c": 5})
    db.zadd(keys.delayed, {"d": 5})
    repair = [keys.body, keys.meta, keys.count, keys.ready, keys.bytes, keys.pickup]
    seen = ["4", "a", "2", "b", "2", "d", "2", "x", "5"]
    assert run(db, REPAIR, [*repair, keys.delayed], [*seen, "c", "y"]) == [1, 1]
    assert db.hgetall(keys.count) == {b"a": b"2", b"b": b"3", b"d": b"2"}
    assert sorted(db.hkeys(keys.body)) == [b"a", b"b", b"d"]
    assert not db.hexists(keys.meta, "c")
    assert db.lrange(keys.ready, 0, -1) == [b"b"]
    assert db.zcard(keys.pickup) == 0
    assert db.get(keys.bytes) == b"3"
    # Confirmed and delayed: removed from the delayed set too.
    assert run(db, REPAIR, [*repair, keys.delayed], ["0", "d"]) == [0, 1]
    assert db.zcard(keys.delayed) == 0


def test_take_marks_every_ready_and_delayed_message_of_a_queue_leaving(db: redis.Redis) -> None:
    """TAKE (a replay of a dead-letter queue): every ready and delayed message leaves
    its lists and is marked leaving (``<now>|replay|``) until the move finishes."""
    keys = queue()
    for guid in ("a", "b"):
        db.hset(keys.body, guid, "p")
        db.hset(keys.meta, guid, "d|1|{}")
    db.rpush(keys.ready, "a")
    db.zadd(keys.delayed, {"b": 5})
    take = [keys.ready, keys.delayed, keys.body, keys.meta, keys.count, keys.leaving]
    reply = run(db, TAKE, take, ["7"])
    assert isinstance(reply, list) and reply[0::4] == [b"a", b"b"]
    assert (db.llen(keys.ready), db.zcard(keys.delayed)) == (0, 0)
    assert db.hgetall(keys.leaving) == {b"a": b"7|replay|", b"b": b"7|replay|"}


def test_purge_removes_every_waiting_message_and_answers_how_many(db: redis.Redis) -> None:
    keys = queue()
    for guid in ("a", "b", "c"):
        db.hset(keys.body, guid, "p")
        db.hset(keys.meta, guid, "d|1|{}")
    db.set(keys.bytes, 3)
    db.rpush(keys.ready, "a")
    db.zadd(keys.delayed, {"b": 5})
    db.rpush(keys.unsynced, "c")
    db.zadd(keys.pickup, {"a": 5})
    purge = [keys.ready, keys.delayed, keys.body, keys.meta, keys.count, keys.pickup]
    assert run(db, PURGE, [*purge, keys.bytes, keys.unsynced], []) == 3
    assert (db.hlen(keys.body), db.zcard(keys.pickup), db.get(keys.bytes)) == (0, 0, b"0")


def test_delete_is_refused_while_a_handle_is_open_and_else_deletes_the_queue(
    db: redis.Redis,
) -> None:
    """All but the write sequence, which stays for ``DELETED_SEQ_TTL`` (a node that
    wrote the queue reads it back for an hour: gone, it read as a Redis gone back,
    issue #32); a PUT to the queue made again goes on from it and keeps it for good."""
    keys = queue()
    db.hset(keys.body, "a", "p")
    db.rpush(keys.ready, "a")
    db.set(keys.seq, 7)
    db.hset(keys.handles, mapping={"n1": 1, "n2": 0})
    delete = [keys.handles, keys.body, keys.seq, keys.ready]
    ttl = [str(DELETED_SEQ_TTL * 1000)]
    assert run(db, DELETE, delete, ttl) == -1
    assert db.ttl(keys.seq) == -1  # a refused delete leaves it all
    db.hset(keys.handles, "n1", 0)
    assert run(db, DELETE, delete, ttl) == 1
    assert not db.exists(keys.body, keys.ready, keys.handles)
    assert db.get(keys.seq) == b"7"
    assert DELETED_SEQ_TTL - 5 <= db.ttl(keys.seq) <= DELETED_SEQ_TTL
    put_keys = [keys.ready, keys.body, keys.meta, keys.bytes, keys.stats, keys.pickup]
    put_keys += [keys.unsynced, keys.seq, keys.consumers]
    header = [keys.prefix + "g:", "60000", "1000", "1700000000000", "0", "0", "0"]
    again = ["g1", "d", "0", "{}", "p", "0"]
    assert run(db, PUT, put_keys, header + again) == [PUT_OUTCOMES["STORED"], 0, 8]
    assert db.ttl(keys.seq) == -1


def test_put_answers_whether_any_node_has_consumers_of_the_queue(db: redis.Redis) -> None:
    """The broker publishes a wake for stored PUTs only when some node has consumers of
    the queue (``puts``): the PUT script reads the published consumer counts."""
    keys = queue()
    put_keys = [keys.ready, keys.body, keys.meta, keys.bytes, keys.stats, keys.pickup]
    put_keys += [keys.unsynced, keys.seq, keys.consumers]
    header = [keys.prefix + "g:", "60000", "1000", "1700000000000", "0", "0", "0"]
    stored = PUT_OUTCOMES["STORED"]
    first, second = ["g1", "d", "0", "{}", "p", "0"], ["g2", "d", "0", "{}", "p", "0"]
    assert run(db, PUT, put_keys, header + first) == [stored, 0, 1]
    db.hset(keys.consumers, "other-node", 1)
    assert run(db, PUT, put_keys, header + second) == [stored, 1, 2]


def test_a_put_of_thousands_stores_each_once_in_order_and_a_repeat_in_it_is_a_replay(
    db: redis.Redis,
) -> None:
    """The PUT script writes a call's new messages in chunks of 2,000 (Lua's stack
    bounds ``unpack``): 5,001 PUTs, one a repeat of an earlier GUID of the same call,
    are 5,000 messages in order, each with its body and meta, their bytes counted once."""
    keys = queue()
    put_keys = [keys.ready, keys.body, keys.meta, keys.bytes, keys.stats, keys.pickup]
    put_keys += [keys.unsynced, keys.seq, keys.consumers]
    header = [keys.prefix + "g:", "60000", "1000", "1700000000000", "0", "0", "0"]
    guids = [f"g{i:05d}" for i in range(5000)]
    args = [value for guid in guids for value in (guid, "7", "0", "{}", "p-" + guid, "0")]
    args += [guids[2500], "7", "0", "{}", "p-" + guids[2500], "0"]  # the same PUT again
    outcomes = run(db, PUT, put_keys, header + args)
    assert outcomes == [PUT_OUTCOMES["STORED"]] * 5000 + [PUT_OUTCOMES["REPLAYED"], 0, 1]
    assert db.lrange(keys.ready, 0, -1) == [guid.encode() for guid in guids]
    assert db.hlen(keys.body) == db.hlen(keys.meta) == 5000
    assert db.hget(keys.body, guids[4999]) == b"p-" + guids[4999].encode()
    assert db.hget(keys.meta, guids[0]) == b"7|1700000000000|{}"
    assert int(db.get(keys.bytes) or 0) == sum(len("p-" + guid) for guid in guids)
    assert int(db.hget(keys.stats, "accepted") or 0) == 5000

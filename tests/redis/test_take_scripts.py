"""The record of a take (``takes``) in the scripts themselves, run on a redis-server
directly: a CLAIM, EXPIRE or SETTLE sent again under its token answers what it took and
takes nothing more; a new token takes afresh; a record of thousands is written in
slices."""

from __future__ import annotations

import pytest
import redis

from holdfast.broker.redis.policy_scripts import EXPIRE, SETTLE
from holdfast.broker.redis.scripts import CLAIM
from holdfast.broker.redis.takes import RECORD_TTL_MS
from tests.redis.scripts_kit import queue, run

pytestmark = pytest.mark.timeout(30)


def test_a_repeated_claim_answers_what_it_took_still_held_and_takes_nothing_more(
    db: redis.Redis,
) -> None:
    """A CLAIM sent again under its token (its reply was lost) answers the messages the
    first run took that are still the node's, with their counts and reasons, counts no
    delivery again and takes nothing; a new token claims afresh (``takes``)."""
    keys = queue()
    for guid in ("a", "b", "c", "spent", "d"):
        db.hset(keys.body, guid, "p-" + guid)
        db.hset(keys.meta, guid, "d|1000|{}")
    db.hset(keys.count, "spent", 2)
    db.rpush(keys.ready, "a", "spent", "b", "c", "d")
    claim = [*keys.message_keys, keys.out("n"), keys.pickup, keys.stats, keys.seq, keys.seq]
    claim.append(keys.took("n", "claim"))

    def claimed(most: int, token: str) -> list[tuple[bytes, int, bytes]]:
        reply = run(db, CLAIM, claim, [str(most), "5000", "2", "0", token])
        assert isinstance(reply, list)
        return [(g, n, r) for g, _, _, n, r in zip(*[iter(reply[:-1])] * 5, strict=True)]

    first = claimed(3, "t1")
    assert first == [(b"a", 1, b""), (b"spent", 2, b"delivery-limit"), (b"b", 1, b"")]
    seq = int(db.get(keys.seq) or 0)
    assert claimed(3, "t1") == first  # the repeat: the same answer
    assert claimed(50, "t1") == first  # whatever it asks for
    assert db.lrange(keys.ready, 0, -1) == [b"c", b"d"]
    assert db.hget(keys.count, "a") == b"1"
    assert int(db.get(keys.seq) or 0) > seq  # moved on, as the claim's answer was
    assert 0 < db.pttl(keys.took("n", "claim")) <= RECORD_TTL_MS
    # One of them confirmed (it was handed out after all): a repeat no longer has it.
    db.zrem(keys.out("n"), "a")
    assert claimed(3, "t1") == first[1:]
    # A new token takes the next ones, and its record replaces the first's.
    assert claimed(1, "t2") == [(b"c", 1, b"")]
    assert claimed(1, "t1") == [(b"d", 1, b"")]  # no longer recorded: a claim like any
    assert claimed(1, "t3") == []
    assert not db.exists(keys.took("n", "claim"))  # nothing taken, nothing recorded
    # A repeat whose messages were all confirmed since answers nothing, and like any
    # script that changes nothing keeps the write sequence (``losses``).
    db.hset(keys.body, "e", "p-e")
    db.hset(keys.meta, "e", "d|1000|{}")
    db.rpush(keys.ready, "e")
    assert claimed(1, "t4") == [(b"e", 1, b"")]
    db.zrem(keys.out("n"), "e")
    seq = int(db.get(keys.seq) or 0)
    assert claimed(1, "t4") == []
    assert int(db.get(keys.seq) or 0) == seq


def test_a_repeated_settle_or_expire_answers_what_it_took_and_records_thousands(
    db: redis.Redis,
) -> None:
    """SETTLE and EXPIRE record what they took under their token the same way; a record
    of thousands of messages is written in slices (Lua's ``unpack`` has a limit)."""
    keys = queue()
    many = [f"m{i:05d}" for i in range(4200)]  # 8,400 values: more than one unpack takes
    pipe = db.pipeline(transaction=False)
    for guid in many:
        pipe.hset(keys.body, guid, "p")
        pipe.hset(keys.meta, guid, "d|1000|{}")
    pipe.execute()
    db.rpush(keys.ready, *many)
    settle = [*keys.message_keys, keys.out("n"), keys.pickup, keys.seq, keys.took("n", "s")]
    args = ["9000", "2000", "0", str(len(many)), "t1"]
    first = run(db, SETTLE, settle, args)
    assert isinstance(first, list) and first[0::5] == [g.encode() for g in many]
    assert run(db, SETTLE, settle, args) == first
    assert db.llen(keys.ready) == 0 and db.zcard(keys.out("n")) == len(many)
    # EXPIRE: the same rule with its own record (a settle's does not answer for it).
    late = queue()
    db.hset(late.body, "x", "p")
    db.hset(late.meta, "x", "d|1000|{}")
    db.rpush(late.ready, "x")
    expire = [*late.message_keys, late.out("n"), late.pickup, late.seq, late.took("n", "e")]
    taken = run(db, EXPIRE, expire, ["9000", "2000", "10", "t1"])
    assert isinstance(taken, list) and taken[0::4] == [b"x"]
    assert run(db, EXPIRE, expire, ["9000", "2000", "10", "t1"]) == taken
    assert run(db, EXPIRE, expire, ["9000", "2000", "10", "t2"]) == []

"""Each Redis script's layout function (``holdfast.broker.redis.script``) against the
Lua it lays out for: as many KEYS as the Lua reads by number, and every ARGV the Lua
reads by number. No Redis needed: a layout that drifts from its Lua fails here before
any lifecycle test has to find out why a message went missing."""

from __future__ import annotations

import re

import pytest

from holdfast.broker.redis import (
    admin_scripts,
    lease_scripts,
    move_scripts,
    policy_scripts,
    put_scripts,
    scripts,
    staging_scripts,
)
from holdfast.broker.redis import staging_side_scripts as side
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.script import Script, ScriptCall, rows
from holdfast.broker.redis.staging import VersionKeys

Q = QueueKeys("hf://layout/q")
V = VersionKeys("hf://layout/q", "app", 3)
GUIDS = [b"g" * 16, b"h" * 16]
PUTS = [put_scripts.PutArgs(guid, "1", 0, "{}", b"p", 0) for guid in GUIDS]

CALLS: list[ScriptCall] = [
    put_scripts.put(
        Q,
        retention_ms=1,
        max_age_ms=1,
        now_ms=1,
        max_messages=0,
        max_bytes=0,
        hold=False,
        puts=PUTS,
    ),
    put_scripts.promote(Q, guid=GUIDS[0]),
    scripts.claim(
        Q, node="n", lease="l", most=1, now_ms=1, max_deliveries=0, cutoff_ms=0, token="t"
    ),
    scripts.confirm(Q, node="n", lease="l", guids=GUIDS),
    scripts.requeue(Q, node="n", lease="l", guids=GUIDS),
    scripts.unclaim(Q, node="n", lease="l", messages=[scripts.Unclaimed(GUIDS[0], 0)]),
    scripts.counts([Q], node="n"),
    scripts.reclaim(Q, node="n"),
    policy_scripts.delay(Q, node="n", lease="l", due_ms=1, guids=GUIDS),
    policy_scripts.release(Q, now_ms=1),
    policy_scripts.expire(Q, node="n", lease="l", now_ms=1, cutoff_ms=0, most=1, token="t"),
    policy_scripts.settle(
        Q, node="n", lease="l", now_ms=1, cutoff_ms=0, max_deliveries=0, released=1, token="t"
    ),
    policy_scripts.repair(Q, counts={GUIDS[0]: 2}, confirmed=[GUIDS[1]]),
    move_scripts.add(
        Q,
        marker_ttl_ms=1,
        moves=[move_scripts.Move(GUIDS[0], "m", "1|1|{}", b"", "r", "hf://d/q", "1|1|{}", 0)],
    ),
    move_scripts.leave(Q, node="n", lease="l", now_ms=1, leaving=[(GUIDS[0], "expired", None)]),
    move_scripts.leaving(Q, since_ms=1),
    move_scripts.gone(Q, guids=GUIDS),
    move_scripts.stay(Q, guids=GUIDS),
    move_scripts.take(Q, now_ms=1),
    admin_scripts.purge(Q),
    admin_scripts.delete(Q, nodes=["n"]),
    admin_scripts.stats(Q),
    admin_scripts.peek(Q, most=1, skip=0),
    staging_scripts.stage_rows(
        V,
        app_id="app",
        version=3,
        partition=0,
        attempt=0,
        deadline_ms=1,
        ttl_ms=1,
        max_rows=1,
        max_bytes=1,
        token="t",
        rows=[(GUIDS[0], b"1|0|{}\np")],
    ),
    staging_scripts.commit_staged(
        V,
        hold=False,
        app_id="app",
        version=3,
        digest=b"d",
        rows=1,
        now_ms=1,
        history_ms=1,
        max_messages=0,
        max_bytes=0,
        attempts={(0, 0): 1},
    ),
    staging_scripts.abort_staged(V),
    side.expire_staged(Q, now_ms=1, most=1),
    side.record_mark("marks", app_id="app", version=3, digest=b"d", rows=1, now_ms=1),
    side.take_budget("b", rows=1, size=1, max_rows=1, max_bytes=1, ttl_ms=1),
    side.count_new("a", sizes=[(GUIDS[0], 1)]),
    side.give_budget("b", rows=1, size=1),
    lease_scripts.next_token("fence", seen=0),
    lease_scripts.lease_start("n.1", token=1, lease_ms=1),
    lease_scripts.renew("n.1", token=1, lease_ms=1, mark=1),
]


def _highest(lua: str, array: str) -> int:
    return max((int(n) for n in re.findall(array + r"\[(\d+)\]", lua)), default=0)


@pytest.mark.parametrize("call", CALLS, ids=lambda call: call.script.name)
def test_a_layout_gives_its_lua_every_key_and_argument_it_reads(call: ScriptCall) -> None:
    lua = call.script.lua
    assert len(call.keys) >= _highest(lua, "KEYS")
    assert len(call.args) >= _highest(lua, "ARGV")
    assert all(isinstance(key, str) and key for key in call.keys)


def test_every_script_has_a_layout_here() -> None:
    modules = (
        admin_scripts,
        lease_scripts,
        move_scripts,
        policy_scripts,
        put_scripts,
        scripts,
        side,
        staging_scripts,
    )
    defined = {v.name for m in modules for v in vars(m).values() if isinstance(v, Script)}
    assert defined == {call.script.name for call in CALLS}


def test_a_put_lays_out_its_puts_in_the_stride_the_lua_reads() -> None:
    call = CALLS[0]
    stride = re.search(r"i = i \+ (\d+)", call.script.lua)
    assert stride is not None and int(stride.group(1)) == len(put_scripts.PutArgs._fields)
    first = int(re.search(r"local i = (\d+)", call.script.lua).group(1))  # type: ignore[union-attr]
    assert [tuple(row) for row in rows(call.args[first - 1 :], len(PUTS[0]))] == PUTS


def test_rows_refuse_a_reply_that_does_not_divide() -> None:
    assert list(rows([1, 2, 3, 4], 2)) == [(1, 2), (3, 4)]
    with pytest.raises(ValueError):
        list(rows([1, 2, 3], 2))

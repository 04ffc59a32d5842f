"""The Lua scripts around transactional writes on the Redis store, apart from a
version's own (``staging_scripts``): the per-token staging budgets (``budgets``:
TAKE_BUDGET, COUNT_NEW, GIVE_BUDGET; a budget is the token's own key, a slot of its
own), the sweep's EXPIRE_STAGED and the commit marks' RECORD_MARK (``marks``); each
with the function that lays out its KEYS and ARGV (``script``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.script import Arg, Script, ScriptCall
from holdfast.broker.redis.staging_scripts import MARK_VERSION

TAKE_BUDGET = Script(
    "TAKE_BUDGET",
    """
-- KEYS: a token's budget. ARGV: rows, bytes, max rows, max bytes, TTL ms.
-- Takes rows and bytes from the token's budget, or refuses: {1} or {0, rows, bytes}.
local rows = tonumber(redis.call('HGET', KEYS[1], 'rows') or '0')
local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
local more_rows, more_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
if rows + more_rows > tonumber(ARGV[3]) or bytes + more_bytes > tonumber(ARGV[4]) then
  return {0, rows, bytes}
end
redis.call('HINCRBY', KEYS[1], 'rows', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'bytes', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1}
""",
)


def take_budget(
    budget: str, *, rows: int, size: int, max_rows: int, max_bytes: int, ttl_ms: int
) -> ScriptCall:
    """TAKE_BUDGET ``rows`` and ``size`` bytes from the token's ``budget`` key."""
    return TAKE_BUDGET.call([budget], [rows, size, max_rows, max_bytes, ttl_ms])


COUNT_NEW = Script(
    "COUNT_NEW",
    """
-- KEYS: attempt. ARGV per row: guid, payload bytes.
-- Returns the rows a STAGE_ROWS of these would add and the bytes it would add (less
-- when it replaces bigger rows): what a token's budget must hold for it.
local new_rows, delta = 0, 0
for i = 1, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if old then
    delta = delta + tonumber(ARGV[i + 1]) - (#old - string.find(old, '\\n', 1, true))
  else
    new_rows, delta = new_rows + 1, delta + tonumber(ARGV[i + 1])
  end
end
return {new_rows, delta}
""",
)


def count_new(attempt: str, *, sizes: Iterable[tuple[bytes, int]]) -> ScriptCall:
    """COUNT_NEW: what staging rows of these (guid, payload bytes) would add to the
    ``attempt`` key."""
    args: list[Arg] = []
    for guid, size in sizes:
        args += [guid, size]
    return COUNT_NEW.call([attempt], args)


GIVE_BUDGET = Script(
    "GIVE_BUDGET",
    """
-- KEYS: a token's budget. ARGV: rows, bytes. Gives them back (never below 0);
-- negative ones are taken.
local function give(field, n)
  -- Never HINCRBY by -0 (what Lua makes of -0): Redis refuses it as not an integer.
  if n ~= 0 then return redis.call('HINCRBY', KEYS[1], field, -n) end
  return tonumber(redis.call('HGET', KEYS[1], field) or '0')
end
local rows = give('rows', tonumber(ARGV[1]))
local bytes = give('bytes', tonumber(ARGV[2]))
if rows <= 0 and bytes <= 0 then redis.call('DEL', KEYS[1]) return 0 end
if rows < 0 then redis.call('HSET', KEYS[1], 'rows', 0) end
if bytes < 0 then redis.call('HSET', KEYS[1], 'bytes', 0) end
return 1
""",
)


def give_budget(budget: str, *, rows: int, size: int) -> ScriptCall:
    """GIVE_BUDGET ``rows`` and ``size`` bytes back to the token's ``budget`` key."""
    return GIVE_BUDGET.call([budget], [rows, size])


EXPIRE_STAGED = Script(
    "EXPIRE_STAGED",
    """
-- KEYS: due, usage, stats. ARGV: now ms, most attempts to expire.
-- Discards the attempts whose deadline passed; returns attempt key, rows, bytes,
-- token and application id of each.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out, total = {}, 0
for _, key in ipairs(due) do
  local version_prefix, h, field = string.match(key, '^(.*st:(%x+):%d+:)(%d+:%d+)$')
  local idx = version_prefix .. 'idx'
  local entry = redis.call('HGET', idx, field)
  local n = redis.call('HLEN', key)
  local b, token = 0, ''
  if entry then
    local bar = string.find(entry, '|', 1, true)
    b, token = tonumber(string.sub(entry, 1, bar - 1)), string.sub(entry, bar + 1)
  end
  redis.call('DEL', key)
  redis.call('HDEL', idx, field)
  redis.call('ZREM', KEYS[1], key)
  local app = redis.call('HGET', KEYS[2], 'a:' .. h) or h
  -- Never HINCRBY by -0 (n is 0 when the attempt's key expired on its own).
  if n > 0 and redis.call('HINCRBY', KEYS[2], 'r:' .. h, -n) <= 0 then
    redis.call('HDEL', KEYS[2], 'r:' .. h, 'b:' .. h, 'a:' .. h)
  elseif b > 0 and redis.call('HINCRBY', KEYS[2], 'b:' .. h, -b) <= 0 then
    redis.call('HDEL', KEYS[2], 'b:' .. h)
  end
  total = total + n
  table.insert(out, key)
  table.insert(out, n)
  table.insert(out, b)
  table.insert(out, token)
  table.insert(out, app)
end
if total > 0 then redis.call('HINCRBY', KEYS[3], 'staged-expired', total) end
return out
""",
)


def expire_staged(queue: QueueKeys, *, now_ms: int, most: int) -> ScriptCall:
    """EXPIRE_STAGED up to ``most`` attempts on ``queue`` past their deadline by
    ``now_ms``; the reply is ``ExpiredAttempt`` rows."""
    return EXPIRE_STAGED.call(
        [queue.prefix + "stdue", queue.prefix + "stusage", queue.stats], [now_ms, most]
    )


class ExpiredAttempt(NamedTuple):
    """One attempt of an EXPIRE_STAGED reply."""

    key: bytes
    rows: int
    size: int
    """Payload bytes."""
    token: bytes
    app: bytes
    """The application id."""


RECORD_MARK = Script(
    "RECORD_MARK",
    MARK_VERSION
    + """
-- KEYS: marks. ARGV: app id, version, digest, rows, now ms.
-- A higher version replaces the mark; otherwise it stays. Returns {changed (0/1),
-- the mark now}.
local mark = redis.call('HGET', KEYS[1], ARGV[1])
if mark_version(mark) >= tonumber(ARGV[2]) then return {0, mark} end
mark = ARGV[2] .. '|' .. ARGV[4] .. '|' .. ARGV[5] .. '|' .. ARGV[3]
redis.call('HSET', KEYS[1], ARGV[1], mark)
return {1, mark}
""",
)


def record_mark(
    marks: str, *, app_id: str, version: int, digest: bytes, rows: int, now_ms: int
) -> ScriptCall:
    """RECORD_MARK ``version`` of ``app_id`` in the queue's ``marks`` hash."""
    return RECORD_MARK.call([marks], [app_id, version, digest, rows, now_ms])


__all__ = [
    "COUNT_NEW",
    "EXPIRE_STAGED",
    "GIVE_BUDGET",
    "RECORD_MARK",
    "TAKE_BUDGET",
    "ExpiredAttempt",
    "count_new",
    "expire_staged",
    "give_budget",
    "record_mark",
    "take_budget",
]

"""The Lua scripts of a transactional write's version on the Redis store: STAGE_ROWS,
COMMIT_STAGED and ABORT_STAGED (one queue's keys each, so one cluster slot), each with
the function that lays out its KEYS and ARGV (``script``). The budgets', the sweep's and
the commit marks' scripts are ``staging_side_scripts``'s. Key names are ``staging``'s.

A staged row is a field of its attempt's hash: GUID -> ``<digest>|<pickup ms>|<properties
JSON>\\n<payload>`` (JSON escapes newlines, so the first one ends the header). An
attempt's entry in its version's index is ``<payload bytes>|<token>``. A commit mark is
``<version>|<rows>|<committed ms>|<digest>`` (the digest last: it is bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from holdfast.broker.redis.script import Arg, Script, ScriptCall
from holdfast.proto import pb

if TYPE_CHECKING:
    from holdfast.broker.redis.staging import VersionKeys

MARK_VERSION = """
local function mark_version(mark)
  if not mark then return -1 end
  return tonumber(string.sub(mark, 1, string.find(mark, '|', 1, true) - 1))
end
local function mark_digest(mark)
  local p = string.find(mark, '|', 1, true)
  p = string.find(mark, '|', p + 1, true)
  p = string.find(mark, '|', p + 1, true)
  return string.sub(mark, p + 1)
end
"""
"""Lua: the version and digest of a commit mark (-1: no mark)."""

DISCARD_VERSION = """
local function discard_version(idx, usage, due, prefix, app, named)
  -- Every attempt of the version leaves: returns the rows of those not in ``named``,
  -- and token, rows, bytes of each attempt (for the token budgets).
  local discarded, released = 0, {}
  local entries = redis.call('HGETALL', idx)
  local rows, bytes = 0, 0
  for j = 1, #entries, 2 do
    local field, entry = entries[j], entries[j + 1]
    local key = prefix .. field
    local n = redis.call('HLEN', key)
    local bar = string.find(entry, '|', 1, true)
    local b = tonumber(string.sub(entry, 1, bar - 1))
    table.insert(released, string.sub(entry, bar + 1))
    table.insert(released, n)
    table.insert(released, b)
    if not named[field] then discarded = discarded + n end
    rows, bytes = rows + n, bytes + b
    redis.call('DEL', key)
    redis.call('ZREM', due, key)
  end
  redis.call('DEL', idx)
  -- Never HINCRBY by -0 (what Lua makes of -0): Redis refuses it as not an integer.
  if rows > 0 and redis.call('HINCRBY', usage, 'r:' .. app, -rows) <= 0 then
    redis.call('HDEL', usage, 'r:' .. app, 'b:' .. app, 'a:' .. app)
  elseif bytes > 0 and redis.call('HINCRBY', usage, 'b:' .. app, -bytes) <= 0 then
    redis.call('HDEL', usage, 'b:' .. app)
  end
  return discarded, released
end
local function reply(head, tail)
  for _, v in ipairs(tail) do table.insert(head, v) end
  return head
end
"""
"""Lua: discard every attempt of one version (see the function's comment); ``reply``
appends a list to a reply."""

STAGE_ROWS = Script(
    "STAGE_ROWS",
    MARK_VERSION
    + """
-- KEYS: attempt, version index, usage, due, marks.
-- ARGV: app id, app hash, version, attempt field, deadline ms, key TTL ms, max rows,
-- max bytes (per queue and application), token, then per row: guid, value.
-- Returns {'COMMITTED'} (the version is committed: nothing staged), {'OTHER_TOKEN'}
-- (another token staged the attempt), {'OVER_LIMIT', rows, bytes} (staged now for the
-- application), or {'STAGED', new rows, bytes added}.
if mark_version(redis.call('HGET', KEYS[5], ARGV[1])) >= tonumber(ARGV[3]) then
  return {'COMMITTED'}
end
if #ARGV < 10 then return {'STAGED', 0, 0} end
local entry = redis.call('HGET', KEYS[2], ARGV[4])
local held = 0
if entry then
  local bar = string.find(entry, '|', 1, true)
  if string.sub(entry, bar + 1) ~= ARGV[9] then return {'OTHER_TOKEN'} end
  held = tonumber(string.sub(entry, 1, bar - 1))
end
local function size(value) return #value - string.find(value, '\\n', 1, true) end
local new_rows, delta = 0, 0
for i = 10, #ARGV, 2 do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if old then
    delta = delta + size(ARGV[i + 1]) - size(old)
  else
    new_rows, delta = new_rows + 1, delta + size(ARGV[i + 1])
  end
end
local h = ARGV[2]
local rows = tonumber(redis.call('HGET', KEYS[3], 'r:' .. h) or '0')
local bytes = tonumber(redis.call('HGET', KEYS[3], 'b:' .. h) or '0')
if rows + new_rows > tonumber(ARGV[7]) or bytes + delta > tonumber(ARGV[8]) then
  return {'OVER_LIMIT', rows, bytes}
end
for i = 10, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('HINCRBY', KEYS[3], 'r:' .. h, new_rows)
redis.call('HINCRBY', KEYS[3], 'b:' .. h, delta)
redis.call('HSET', KEYS[3], 'a:' .. h, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[4], (held + delta) .. '|' .. ARGV[9])
redis.call('ZADD', KEYS[4], ARGV[5], KEYS[1])
for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ARGV[6]) end
return {'STAGED', new_rows, delta}
""",
)


def stage_rows(
    keys: VersionKeys,
    *,
    app_id: str,
    version: int,
    partition: int,
    attempt: int,
    deadline_ms: int,
    ttl_ms: int,
    max_rows: int,
    max_bytes: int,
    token: str,
    rows: Iterable[tuple[bytes, bytes]],
) -> ScriptCall:
    """STAGE_ROWS ``rows`` (guid, ``staging.row_value``) for one attempt of ``version``,
    for ``token``; ``max_rows`` and ``max_bytes`` bound the application's staged rows on
    the queue."""
    args: list[Arg] = [
        *(app_id, keys.app, version, f"{partition}:{attempt}", deadline_ms, ttl_ms),
        *(max_rows, max_bytes, token),
    ]
    for guid, value in rows:
        args += [guid, value]
    return STAGE_ROWS.call(
        [keys.attempt(partition, attempt), keys.index, keys.usage, keys.due, keys.marks], args
    )


COMMIT_STAGED = Script(
    "COMMIT_STAGED",
    MARK_VERSION
    + DISCARD_VERSION
    + """
-- KEYS: ready (the unsynced list with --redis-min-replicas: ``durable``), body, meta,
-- bytes, stats, pickup, marks, version index, usage, due, write sequence.
-- ARGV: app id, app hash, version, digest, rows, now ms, history key prefix, history
-- retention ms, max messages (0: none), max bytes (0: none), attempt key prefix, then
-- per named attempt: its field and the rows its task staged.
-- Decides before it writes: {'ALREADY', discarded, released...} (committed before),
-- {'CHANGED', mark} (committed before with another digest), {'MISSING', field, have,
-- reported}, {'REPEATED', n}, {'CONFLICT', n} (staged GUIDs the queue knows with other
-- content), {'FULL', messages, bytes}; or publishes every named row as a PUT would,
-- records the mark, discards the version's other attempts: {'PUBLISHED', rows,
-- discarded, released...}.
local app, h, version = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now, prefix = ARGV[6], ARGV[11]
local mark = redis.call('HGET', KEYS[7], app)
local named, order = {}, {}
for i = 12, #ARGV, 2 do
  named[ARGV[i]] = tonumber(ARGV[i + 1])
  table.insert(order, ARGV[i])
end
if mark_version(mark) >= version then
  if mark_version(mark) == version and mark_digest(mark) ~= ARGV[4] then
    return {'CHANGED', mark}
  end
  local discarded, released = discard_version(KEYS[8], KEYS[9], KEYS[10], prefix, h, {})
  return reply({'ALREADY', discarded}, released)
end
for _, field in ipairs(order) do
  local have = redis.call('HLEN', prefix .. field)
  if have ~= named[field] then return {'MISSING', field, have, named[field]} end
end
local guids, values, seen, repeated = {}, {}, {}, 0
for _, field in ipairs(order) do
  local all = redis.call('HGETALL', prefix .. field)
  for j = 1, #all, 2 do
    if seen[all[j]] then
      repeated = repeated + 1
    else
      seen[all[j]] = true
      table.insert(guids, all[j])
      table.insert(values, all[j + 1])
    end
  end
end
if repeated > 0 then return {'REPEATED', repeated} end
local history = ARGV[7]
local fresh, conflicts, add_n, add_b = {}, 0, 0, 0
for j, guid in ipairs(guids) do
  local value = values[j]
  local nl = string.find(value, '\\n', 1, true)
  local digest = string.sub(value, 1, string.find(value, '|', 1, true) - 1)
  local known = redis.call('HGET', KEYS[3], guid)
  local was
  if known then
    was = string.sub(known, 1, string.find(known, '|', 1, true) - 1)
  else
    was = redis.call('GET', history .. guid)
  end
  if was then
    if was ~= digest then conflicts = conflicts + 1 end
  else
    table.insert(fresh, j)
    add_n, add_b = add_n + 1, add_b + #value - nl
  end
end
if conflicts > 0 then return {'CONFLICT', conflicts} end
local max_n, max_b = tonumber(ARGV[9]), tonumber(ARGV[10])
local n = redis.call('HLEN', KEYS[2])
local b = tonumber(redis.call('GET', KEYS[4]) or '0')
if (max_n > 0 and n + add_n > max_n) or (max_b > 0 and b + add_b > max_b) then
  return {'FULL', n, b}
end
local pushed, added = {}, 0
for _, j in ipairs(fresh) do
  local guid, value = guids[j], values[j]
  local nl = string.find(value, '\\n', 1, true)
  local p1 = string.find(value, '|', 1, true)
  local p2 = string.find(value, '|', p1 + 1, true)
  local digest, pickup = string.sub(value, 1, p1 - 1), tonumber(string.sub(value, p1 + 1, p2 - 1))
  local payload = string.sub(value, nl + 1)
  redis.call('HSET', KEYS[2], guid, payload)
  local properties = string.sub(value, p2 + 1, nl - 1)
  redis.call('HSET', KEYS[3], guid, digest .. '|' .. now .. '|' .. properties)
  redis.call('SET', history .. guid, digest, 'PX', ARGV[8])
  if pickup > 0 then redis.call('ZADD', KEYS[6], tonumber(now) + pickup, guid) end
  added = added + #payload
  -- Pushed in publishing order, a thousand at a time (fewer calls, a bounded unpack).
  table.insert(pushed, guid)
  if #pushed == 1000 then
    redis.call('RPUSH', KEYS[1], unpack(pushed))
    pushed = {}
  end
end
if #pushed > 0 then redis.call('RPUSH', KEYS[1], unpack(pushed)) end
if added > 0 then redis.call('INCRBY', KEYS[4], added) end
if #fresh > 0 then
  redis.call('HINCRBY', KEYS[5], 'accepted', #fresh)
  redis.call('INCR', KEYS[11])  -- the queue's write sequence (``losses``)
  redis.call('PERSIST', KEYS[11])  -- kept for good once used again (scripts' SEQ)
end
redis.call('HSET', KEYS[7], app, ARGV[3] .. '|' .. ARGV[5] .. '|' .. now .. '|' .. ARGV[4])
local discarded, released = discard_version(KEYS[8], KEYS[9], KEYS[10], prefix, h, named)
if discarded > 0 then redis.call('HINCRBY', KEYS[5], 'staged-discarded', discarded) end
return reply({'PUBLISHED', #guids, discarded}, released)
""",
)


def commit_staged(
    keys: VersionKeys,
    *,
    hold: bool,
    app_id: str,
    version: int,
    digest: bytes,
    rows: int,
    now_ms: int,
    history_ms: int,
    max_messages: int,
    max_bytes: int,
    attempts: Mapping[tuple[int, int], int],
) -> ScriptCall:
    """COMMIT_STAGED ``version``: the named ``attempts`` ((partition, attempt) -> the
    rows the writer reported) publish ``rows`` rows of content ``digest``. With ``hold``
    they wait in the unsynced list until replicas have them (``durable``), as PUTs do;
    0 for ``max_messages`` or ``max_bytes`` is no limit."""
    queue = keys.queue
    args: list[Arg] = [
        *(app_id, keys.app, version, digest, rows, now_ms, queue.prefix + "g:", history_ms),
        *(max_messages, max_bytes, keys.prefix),
    ]
    for (partition, attempt), count in attempts.items():
        args += [f"{partition}:{attempt}", count]
    return COMMIT_STAGED.call(
        [
            queue.unsynced if hold else queue.ready,
            *(queue.body, queue.meta, queue.bytes, queue.stats, queue.pickup),
            *(keys.marks, keys.index, keys.usage, keys.due, queue.seq),
        ],
        args,
    )


ABORT_STAGED = Script(
    "ABORT_STAGED",
    DISCARD_VERSION
    + """
-- KEYS: version index, usage, due, stats. ARGV: app hash, attempt key prefix.
-- Returns the rows discarded, then token, rows, bytes of each attempt.
local discarded, released = discard_version(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[1], {})
if discarded > 0 then redis.call('HINCRBY', KEYS[4], 'staged-discarded', discarded) end
return reply({discarded}, released)
""",
)


def abort_staged(keys: VersionKeys) -> ScriptCall:
    """ABORT_STAGED every attempt of the version of ``keys``."""
    return ABORT_STAGED.call(
        [keys.index, keys.usage, keys.due, keys.queue.stats], [keys.app, keys.prefix]
    )


STATUS: dict[str, pb.Status] = {
    "MISSING": pb.STATUS_NOT_FOUND,
    "REPEATED": pb.STATUS_CONFLICT,
    "CONFLICT": pb.STATUS_CONFLICT,
    "CHANGED": pb.STATUS_CONFLICT,
    "FULL": pb.STATUS_QUEUE_FULL,
}
"""The wire status of each refusal COMMIT_STAGED returns."""

__all__ = [
    "ABORT_STAGED",
    "COMMIT_STAGED",
    "STAGE_ROWS",
    "STATUS",
    "abort_staged",
    "commit_staged",
    "stage_rows",
]

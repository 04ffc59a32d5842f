"""The Lua scripts of a queue's life on the Redis store: PUT, CLAIM, UNCLAIM, CONFIRM,
REQUEUE and RECLAIM (policies, moves and the admin's scripts are in ``policy_scripts``).

Every script touches the keys of one queue only (one hash tag), so it runs on the
one cluster node that holds the queue; those that change a delivery take the node's
lease key last and refuse (``FENCED``) once it has lapsed (``lease``). Statuses
returned by ``PUT`` are the wire statuses' numbers. A message's meta is
``<digest>|<accepted_ms>|<properties JSON>``.
"""

from __future__ import annotations

from holdfast.broker.redis.lease_scripts import FENCE
from holdfast.proto import pb

ACCEPTED = """
local function accepted(meta)
  local p1 = string.find(meta, '|', 1, true)
  return tonumber(string.sub(meta, p1 + 1, string.find(meta, '|', p1 + 1, true) - 1))
end
"""
"""Lua: the acceptance time (ms) in a message's meta."""

EMIT = """
local function emit(out, guid, body, meta_key, count_key)
  table.insert(out, guid)
  table.insert(out, body)
  table.insert(out, redis.call('HGET', meta_key, guid))
  table.insert(out, tonumber(redis.call('HGET', count_key, guid) or '0'))
end
"""
"""Lua: append guid, payload, meta and delivery count to a reply."""

DROP = """
local function drop(guid)
  local size = redis.call('HSTRLEN', KEYS[1], guid)
  redis.call('HDEL', KEYS[1], guid)
  redis.call('HDEL', KEYS[2], guid)
  redis.call('HDEL', KEYS[3], guid)
  redis.call('ZREM', KEYS[6], guid)
  if size > 0 then redis.call('DECRBY', KEYS[5], size) end
end
"""
"""Lua: remove a message for good (KEYS: body, meta, count, -, bytes, pickup)."""

SEQ = """
local function seq(key, wrote)
  -- The queue's write sequence: up by one per script that changed the queue, read by
  -- the node that ran it (``losses``): a Redis that goes back in time shows a lower one.
  if wrote then return redis.call('INCR', key) end
  return tonumber(redis.call('GET', key) or '0')
end
"""
"""Lua: move a queue's write sequence on (when ``wrote``) and return it."""

PUT_STORED = -1
"""The PUT script's outcome for a PUT it stored."""
PUT_REPLAYED = -2
"""The PUT script's outcome for a replay of a GUID it knows with the same content."""
PUT_OUTCOMES = {
    "STORED": PUT_STORED,
    "REPLAYED": PUT_REPLAYED,
    "CONFLICT": pb.STATUS_CONFLICT,
    "TOO_OLD": pb.STATUS_TOO_OLD,
    "QUEUE_FULL": pb.STATUS_QUEUE_FULL,
}
"""Every outcome the PUT script returns, by the name its Lua uses: the wire statuses from
the generated enum, the two successes negative so that they are no wire status."""

PUT = (
    "".join(f"local {name} = {value}\n" for name, value in PUT_OUTCOMES.items())
    + SEQ
    + """
-- KEYS: ready, body, meta, bytes, stats, pickup, unsynced, seq.
-- ARGV: history key prefix, retention ms, max age ms, now ms, max messages (0: no
-- limit), max bytes (0: no limit), hold ('1': new messages wait in unsynced until
-- replicas have them), then per PUT: guid, digest, age ms, properties JSON, payload,
-- pickup deadline ms (0: none).
-- Returns an outcome per PUT: STORED, REPLAYED, or the wire status CONFLICT,
-- TOO_OLD or QUEUE_FULL (the numbers are put in from Python: see PUT_OUTCOMES), then
-- the queue's write sequence.
local prefix, retention, max_age, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local max_n, max_b = tonumber(ARGV[5]), tonumber(ARGV[6])
local visible = KEYS[1]
if ARGV[7] == '1' then visible = KEYS[7] end
local n, b = 0, 0
if max_n > 0 then n = redis.call('HLEN', KEYS[2]) end
if max_b > 0 then b = tonumber(redis.call('GET', KEYS[4]) or '0') end
local out, added = {}, 0
local i = 8
while i <= #ARGV do
  local guid, digest, age, payload = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 4]
  local known = redis.call('HGET', KEYS[3], guid)
  if known then
    local d = string.sub(known, 1, string.find(known, '|', 1, true) - 1)
    if d == digest then table.insert(out, REPLAYED) else table.insert(out, CONFLICT) end
  else
    local h = redis.call('GET', prefix .. guid)
    if h then
      if h == digest then table.insert(out, REPLAYED) else table.insert(out, CONFLICT) end
    elseif age > max_age then
      table.insert(out, TOO_OLD)
    elseif (max_n > 0 and n + 1 > max_n) or (max_b > 0 and b + #payload > max_b) then
      table.insert(out, QUEUE_FULL)
    else
      redis.call('HSET', KEYS[2], guid, payload)
      redis.call('HSET', KEYS[3], guid, digest .. '|' .. now .. '|' .. ARGV[i + 3])
      redis.call('RPUSH', visible, guid)
      redis.call('SET', prefix .. guid, digest, 'PX', retention)
      redis.call('INCRBY', KEYS[4], #payload)
      if ARGV[i + 5] ~= '0' then redis.call('ZADD', KEYS[6], ARGV[i + 5], guid) end
      n, b, added = n + 1, b + #payload, added + 1
      table.insert(out, STORED)
    end
  end
  i = i + 6
end
if added > 0 then redis.call('HINCRBY', KEYS[5], 'accepted', added) end
table.insert(out, seq(KEYS[8], added > 0))
return out
"""
)

CLAIM = (
    ACCEPTED
    + FENCE
    + SEQ
    + """
-- KEYS: ready, body, meta, count, out(node), pickup, stats, lease, seq.
-- ARGV: n, now ms, max deliveries (0: no limit), TTL cutoff ms (0: no TTL).
-- Moves up to n ready messages to the node's deliveries. One that may still be
-- delivered has its delivery counted; one past its delivery limit, the queue's TTL
-- or its pickup deadline is not (the node buries it). Returns guid, payload, meta,
-- count and the reason it is dead ('' if it is not) for each, then the write sequence.
if fenced(KEYS[8]) then return redis.error_reply('FENCED: the node lease lapsed') end
local now, max_d, cutoff = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out, redelivered = {}, 0
for _ = 1, tonumber(ARGV[1]) do
  local guid = redis.call('LPOP', KEYS[1])
  if not guid then break end
  local body = redis.call('HGET', KEYS[2], guid)
  if body then
    local meta = redis.call('HGET', KEYS[3], guid)
    local count = tonumber(redis.call('HGET', KEYS[4], guid) or '0')
    local reason = ''
    if max_d > 0 and count >= max_d then
      reason = 'delivery-limit'
    else
      if cutoff > 0 and accepted(meta) <= cutoff then
        reason = 'expired'
      elseif count == 0 then
        local deadline = redis.call('ZSCORE', KEYS[6], guid)
        if deadline and tonumber(deadline) <= now then reason = 'expired' end
      end
    end
    if reason == '' then
      count = redis.call('HINCRBY', KEYS[4], guid, 1)
      if count > 1 then redelivered = redelivered + 1 end
    end
    redis.call('ZREM', KEYS[6], guid)
    redis.call('ZADD', KEYS[5], now, guid)
    table.insert(out, guid)
    table.insert(out, body)
    table.insert(out, meta)
    table.insert(out, count)
    table.insert(out, reason)
  end
end
if redelivered > 0 then redis.call('HINCRBY', KEYS[7], 'redelivered', redelivered) end
table.insert(out, seq(KEYS[9], #out > 0))
return out
"""
)

CONFIRM = (
    DROP
    + FENCE
    + SEQ
    + """
-- KEYS: body, meta, count, out(node), bytes, pickup, lease, seq. ARGV: guids.
-- Removes each message the node delivered; returns how many, and the write sequence.
if fenced(KEYS[7]) then return redis.error_reply('FENCED: the node lease lapsed') end
local n = 0
for _, guid in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[4], guid) == 1 then
    drop(guid)
    n = n + 1
  end
end
return {n, seq(KEYS[8], n > 0)}
"""
)

REQUEUE = (
    FENCE
    + """
-- KEYS: ready, out(node), lease. ARGV: guids in delivery order. Back to the head,
-- in order.
if fenced(KEYS[3]) then return redis.error_reply('FENCED: the node lease lapsed') end
local n = 0
for i = #ARGV, 1, -1 do
  if redis.call('ZREM', KEYS[2], ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n
"""
)

UNCLAIM = (
    FENCE
    + """
-- KEYS: ready, count, out(node), pickup, stats, lease.
-- ARGV: per message, in claim order: guid, pickup deadline ms (0: none).
-- Claimed messages the node had no consumer for (they left while the claim was on
-- its way): back to the head, in order, as if never claimed. Their delivery is
-- uncounted (CLAIM counted it) and one never delivered gets its pickup deadline back.
-- Returns how many.
if fenced(KEYS[6]) then return redis.error_reply('FENCED: the node lease lapsed') end
local n, redelivered = 0, 0
for i = #ARGV - 1, 1, -2 do
  local guid = ARGV[i]
  if redis.call('ZREM', KEYS[3], guid) == 1 then
    local count = redis.call('HINCRBY', KEYS[2], guid, -1)
    if count > 0 then
      redelivered = redelivered + 1
    else
      redis.call('HDEL', KEYS[2], guid)
      if ARGV[i + 1] ~= '0' then redis.call('ZADD', KEYS[4], ARGV[i + 1], guid) end
    end
    redis.call('LPUSH', KEYS[1], guid)
    n = n + 1
  end
end
if redelivered > 0 then redis.call('HINCRBY', KEYS[5], 'redelivered', -redelivered) end
return n
"""
)

PROMOTE = """
-- KEYS: unsynced, ready. ARGV: a GUID replicas are known to have.
-- It and every GUID stored before it (replication keeps Redis's order) become
-- ready, in order. Returns how many.
local at = redis.call('LPOS', KEYS[1], ARGV[1])
if not at then return 0 end
local guids = redis.call('LRANGE', KEYS[1], 0, at)
redis.call('LTRIM', KEYS[1], at + 1, -1)
for _, guid in ipairs(guids) do redis.call('RPUSH', KEYS[2], guid) end
return #guids
"""

COUNTS = """
-- KEYS: per queue: ready, delayed, bytes, unsynced, consumers. ARGV: this node's
-- incarnation. Read-only; for many queues at once (not on a cluster, where each
-- queue is a slot of its own). Returns per queue: ready + delayed, payload bytes,
-- unsynced, and the consumers attached on other nodes.
local out = {}
for i = 1, #KEYS, 5 do
  local others, counts = 0, redis.call('HGETALL', KEYS[i + 4])
  for j = 1, #counts, 2 do
    if counts[j] ~= ARGV[1] then others = others + tonumber(counts[j + 1]) end
  end
  table.insert(out, redis.call('LLEN', KEYS[i]) + redis.call('ZCARD', KEYS[i + 1]))
  table.insert(out, tonumber(redis.call('GET', KEYS[i + 2]) or '0'))
  table.insert(out, redis.call('LLEN', KEYS[i + 3]))
  table.insert(out, others)
end
return out
"""

RECLAIM = """
-- KEYS: ready, out(dead node), consumers, handles. ARGV: dead node id.
-- A dead node's deliveries go back to the head of the queue, oldest first.
local guids = redis.call('ZRANGE', KEYS[2], 0, -1)
for i = #guids, 1, -1 do
  redis.call('LPUSH', KEYS[1], guids[i])
end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return #guids
"""

__all__ = ["CLAIM", "CONFIRM", "COUNTS", "PROMOTE", "PUT", "RECLAIM", "REQUEUE", "UNCLAIM"]
"""The scripts, each registered by this name (``ACCEPTED``, ``EMIT`` and ``DROP`` are
pieces of them; ``PUT_OUTCOMES`` are the numbers ``PUT`` answers with)."""

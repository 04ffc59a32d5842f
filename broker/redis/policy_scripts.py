"""The Lua scripts of queue policies, dead-letter moves and the admin service on the
Redis store. Like ``scripts``, each touches one queue's keys only (one hash tag).

A move between two queues (to a dead-letter queue, or a replay back) is three
scripts, because the queues may live on different cluster nodes: ``LEAVE`` (or
``TAKE``) marks the message as leaving its source (``hf:{source}:leaving``: no longer
delivered, not yet gone), ``ADD`` puts the copy in the target, ``GONE`` removes the
source. A move interrupted after the first step (the node died, Redis failed) is
finished by any node later (``LEAVING`` lists it); ``ADD`` sets a marker per move
(``hf:{target}:mv:<id>``) so that finishing it twice adds one copy: the message
ends in exactly one queue.
"""

from __future__ import annotations

from holdfast.broker.redis.lease_scripts import FENCE
from holdfast.broker.redis.scripts import ACCEPTED, DROP, EMIT

DELAY = (
    FENCE
    + """
-- KEYS: out(node), delayed, lease. ARGV: due ms, guids. Rejected with a delay: held
-- back.
if fenced(KEYS[3]) then return redis.error_reply('FENCED: the node lease lapsed') end
local n = 0
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[i])
    n = n + 1
  end
end
return n
"""
)

RELEASE = """
-- KEYS: delayed, ready. ARGV: now ms. Due delayed messages go to the head, the
-- earliest due first.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for i = #due, 1, -1 do
  redis.call('ZREM', KEYS[1], due[i])
  redis.call('LPUSH', KEYS[2], due[i])
end
return #due
"""

EXPIRE = (
    ACCEPTED
    + EMIT
    + FENCE
    + """
-- KEYS: ready, body, meta, count, out(node), pickup, lease.
-- ARGV: now ms, TTL cutoff ms (0: no TTL), most messages.
-- Takes ready messages accepted at or before the cutoff and never-delivered ones past
-- their pickup deadline into the node's deliveries, for the node to bury. Returns
-- guid, payload, meta, count for each. Never-delivered messages are in acceptance
-- order, but a released one goes to the head and may be newer than those behind it:
-- the scan steps over delivered ones within the TTL and stops at the first
-- never-delivered one within it.
if fenced(KEYS[7]) then return redis.error_reply('FENCED: the node lease lapsed') end
local now, cutoff, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local function take(guid)
  redis.call('ZREM', KEYS[6], guid)
  redis.call('ZADD', KEYS[5], now, guid)
  emit(out, guid, redis.call('HGET', KEYS[2], guid), KEYS[3], KEYS[4])
end
local at = 0
while cutoff > 0 and #out < most * 4 do
  local guid = redis.call('LINDEX', KEYS[1], at)
  if not guid then break end
  local meta = redis.call('HGET', KEYS[3], guid)
  if not meta then
    redis.call('LREM', KEYS[1], 1, guid)
  elseif accepted(meta) <= cutoff then
    redis.call('LREM', KEYS[1], 1, guid)
    take(guid)
  elseif tonumber(redis.call('HGET', KEYS[4], guid) or '0') > 0 then
    at = at + 1
  else
    break
  end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, most)
for _, guid in ipairs(due) do
  redis.call('ZREM', KEYS[6], guid)
  local count = tonumber(redis.call('HGET', KEYS[4], guid) or '0')
  if count == 0 and redis.call('LREM', KEYS[1], 1, guid) == 1 then take(guid) end
end
return out
"""
)

SETTLE = (
    ACCEPTED
    + EMIT
    + FENCE
    + """
-- KEYS: ready, body, meta, count, out(node), pickup, lease.
-- ARGV: now ms, TTL cutoff ms (0: no TTL), max deliveries (0: no limit), n.
-- The lifecycle's release guards (holdfast.broker.lifecycle.release) for the first n
-- ready messages, just put back at the head (a reject delay over, a dead node's
-- deliveries): one spent or past its TTL is taken into the node's deliveries for the
-- node to bury. Returns guid, payload, meta, count and the reason for each.
if fenced(KEYS[7]) then return redis.error_reply('FENCED: the node lease lapsed') end
local now, cutoff, max_d = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for _, guid in ipairs(redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)) do
  local meta = redis.call('HGET', KEYS[3], guid)
  if meta then
    local count = tonumber(redis.call('HGET', KEYS[4], guid) or '0')
    local reason = ''
    if max_d > 0 and count >= max_d then
      reason = 'delivery-limit'
    elseif cutoff > 0 and accepted(meta) <= cutoff then
      reason = 'expired'
    end
    if reason ~= '' then
      redis.call('LREM', KEYS[1], 1, guid)
      redis.call('ZREM', KEYS[6], guid)
      redis.call('ZADD', KEYS[5], now, guid)
      emit(out, guid, redis.call('HGET', KEYS[2], guid), KEYS[3], KEYS[4])
      table.insert(out, reason)
    end
  end
end
return out
"""
)

ADD = """
-- KEYS: ready, body, meta, count, bytes. ARGV: marker prefix, marker TTL ms, then per
-- message: guid, move id, meta, payload. Appends each message whose move has not
-- been done before and whose GUID the queue does not hold; returns how many.
local prefix, ttl, added = ARGV[1], ARGV[2], 0
local i = 3
while i <= #ARGV do
  local guid, payload = ARGV[i], ARGV[i + 3]
  if redis.call('SET', prefix .. ARGV[i + 1], 1, 'NX', 'PX', ttl) then
    if redis.call('HEXISTS', KEYS[2], guid) == 0 then
      redis.call('HSET', KEYS[2], guid, payload)
      redis.call('HSET', KEYS[3], guid, ARGV[i + 2])
      redis.call('HDEL', KEYS[4], guid)
      redis.call('RPUSH', KEYS[1], guid)
      redis.call('INCRBY', KEYS[5], #payload)
      added = added + 1
    end
  end
  i = i + 4
end
return added
"""

LEAVE = (
    FENCE
    + """
-- KEYS: out(node), leaving, lease. ARGV: now ms, then per message: guid,
-- "<reason>|<target>". The node's deliveries that are to move: leaving. Returns how
-- many.
if fenced(KEYS[3]) then return redis.error_reply('FENCED: the node lease lapsed') end
local n = 0
for i = 2, #ARGV, 2 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[1] .. '|' .. ARGV[i + 1])
    n = n + 1
  end
end
return n
"""
)

LEAVING = (
    EMIT
    + """
-- KEYS: leaving, body, meta, count. ARGV: since ms.
-- Moves begun at or before ``since`` and not finished: guid, payload, meta, count and
-- "<reason>|<target>" for each.
local out = {}
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local guid, value = entries[i], entries[i + 1]
  local bar = string.find(value, '|', 1, true)
  if tonumber(string.sub(value, 1, bar - 1)) <= tonumber(ARGV[1]) then
    local body = redis.call('HGET', KEYS[2], guid)
    if body then
      emit(out, guid, body, KEYS[3], KEYS[4])
      table.insert(out, string.sub(value, bar + 1))
    else
      redis.call('HDEL', KEYS[1], guid)
    end
  end
end
return out
"""
)

GONE = (
    DROP
    + """
-- KEYS: body, meta, count, leaving, bytes, pickup. ARGV: guids.
-- Moves finished: the source's copy goes. Returns how many.
local n = 0
for _, guid in ipairs(ARGV) do
  if redis.call('HDEL', KEYS[4], guid) == 1 then
    drop(guid)
    n = n + 1
  end
end
return n
"""
)

STAY = """
-- KEYS: leaving, ready. ARGV: guids. Moves not to be made: back to the head, in order.
local n = 0
for i = #ARGV, 1, -1 do
  if redis.call('HDEL', KEYS[1], ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n
"""

TAKE = (
    EMIT
    + """
-- KEYS: ready, delayed, body, meta, count, leaving. ARGV: now ms.
-- Every ready and delayed message of a dead-letter queue leaves (a replay).
-- Returns guid, payload, meta, count for each.
local guids = redis.call('LRANGE', KEYS[1], 0, -1)
for _, guid in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do table.insert(guids, guid) end
redis.call('DEL', KEYS[1], KEYS[2])
local out = {}
for _, guid in ipairs(guids) do
  local body = redis.call('HGET', KEYS[3], guid)
  if body then
    redis.call('HSET', KEYS[6], guid, ARGV[1] .. '|replay|')
    emit(out, guid, body, KEYS[4], KEYS[5])
  end
end
return out
"""
)

REPAIR = """
-- KEYS: body, meta, count, ready, bytes, pickup, delayed.
-- ARGV: n, then n pairs guid, delivery count the node saw; then confirmed guids.
-- After Redis went back in time: a message still here gets at least the count the
-- node saw (counts never go back), and one the node saw confirmed is removed again.
-- Returns {counts raised, messages removed}.
local n, raised, removed = tonumber(ARGV[1]), 0, 0
for i = 2, 1 + 2 * n, 2 do
  local guid, seen = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('HEXISTS', KEYS[1], guid) == 1
    and tonumber(redis.call('HGET', KEYS[3], guid) or '0') < seen then
    redis.call('HSET', KEYS[3], guid, seen)
    raised = raised + 1
  end
end
for i = 2 + 2 * n, #ARGV do
  local guid = ARGV[i]
  local size = redis.call('HSTRLEN', KEYS[1], guid)
  if redis.call('HDEL', KEYS[1], guid) == 1 then
    redis.call('HDEL', KEYS[2], guid)
    redis.call('HDEL', KEYS[3], guid)
    redis.call('LREM', KEYS[4], 1, guid)
    redis.call('ZREM', KEYS[6], guid)
    redis.call('ZREM', KEYS[7], guid)
    if size > 0 then redis.call('DECRBY', KEYS[5], size) end
    removed = removed + 1
  end
end
return {raised, removed}
"""

PURGE = """
-- KEYS: ready, delayed, body, meta, count, pickup, bytes, unsynced. Removes every
-- ready, delayed and unsynced message (consumers keep what they hold); returns how
-- many.
local guids = redis.call('LRANGE', KEYS[1], 0, -1)
for _, guid in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do table.insert(guids, guid) end
for _, guid in ipairs(redis.call('LRANGE', KEYS[8], 0, -1)) do table.insert(guids, guid) end
local n = 0
for _, guid in ipairs(guids) do
  local size = redis.call('HSTRLEN', KEYS[3], guid)
  if redis.call('HDEL', KEYS[3], guid) == 1 then
    n = n + 1
    if size > 0 then redis.call('DECRBY', KEYS[7], size) end
  end
  redis.call('HDEL', KEYS[4], guid)
  redis.call('HDEL', KEYS[5], guid)
  redis.call('ZREM', KEYS[6], guid)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[8])
return n
"""

DELETE = """
-- KEYS: handles, body, then every other key of the queue (ready, delayed, meta, ...,
-- each node's deliveries). Refused (returns minus the open handles) while any node
-- has the queue open; else deletes it and returns how many messages went.
local handles = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do handles = handles + tonumber(v) end
if handles > 0 then return -handles end
local n = redis.call('HLEN', KEYS[2])
for _, key in ipairs(KEYS) do redis.call('DEL', key) end
return n
"""

STATS = (
    ACCEPTED
    + """
-- KEYS: ready, delayed, body, bytes, consumers, handles, stats, meta.
-- Returns ready, delayed, messages, bytes, consumers, handles, the accepted ms of the
-- head (-1 if empty), then the counters as field, value pairs.
local function sum(key)
  local total = 0
  for _, v in ipairs(redis.call('HVALS', key)) do total = total + tonumber(v) end
  return total
end
local head, head_ms = redis.call('LINDEX', KEYS[1], 0), -1
if head then
  local meta = redis.call('HGET', KEYS[8], head)
  if meta then head_ms = accepted(meta) end
end
local out = {
  redis.call('LLEN', KEYS[1]), redis.call('ZCARD', KEYS[2]), redis.call('HLEN', KEYS[3]),
  tonumber(redis.call('GET', KEYS[4]) or '0'), sum(KEYS[5]), sum(KEYS[6]), head_ms,
}
for _, v in ipairs(redis.call('HGETALL', KEYS[7])) do table.insert(out, v) end
return out
"""
)

PEEK = (
    EMIT
    + """
-- KEYS: ready, body, meta, count. ARGV: most, skip. Ready messages after the first
-- skip, left in place: guid, payload, meta, count for each.
local skip = tonumber(ARGV[2] or 0)
local out = {}
for _, guid in ipairs(redis.call('LRANGE', KEYS[1], skip, skip + tonumber(ARGV[1]) - 1)) do
  local body = redis.call('HGET', KEYS[2], guid)
  if body then emit(out, guid, body, KEYS[3], KEYS[4]) end
end
return out
"""
)

__all__ = [
    "ADD",
    "DELAY",
    "DELETE",
    "EXPIRE",
    "GONE",
    "LEAVE",
    "LEAVING",
    "PEEK",
    "PURGE",
    "RELEASE",
    "REPAIR",
    "SETTLE",
    "STATS",
    "STAY",
    "TAKE",
]

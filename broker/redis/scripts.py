"""The Lua scripts of the Redis store: each step of a queue is one atomic script.

Every script touches the keys of one queue only (one hash tag), so it runs on the
one cluster node that holds the queue. Statuses returned by ``PUT`` are the wire
statuses' numbers.
"""

from __future__ import annotations

PUT = """
-- KEYS: ready, body, meta. ARGV: history key prefix, retention ms, max age ms, now ms,
-- then per PUT: guid, digest, age ms, properties JSON, payload.
-- Returns a status per PUT: 1 OK new, 2 OK replay, 19 CONFLICT, 18 TOO_OLD.
local prefix, retention, max_age, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out = {}
local i = 5
while i <= #ARGV do
  local guid, digest, age = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local known = redis.call('HGET', KEYS[3], guid)
  if known then
    local d = string.sub(known, 1, string.find(known, '|', 1, true) - 1)
    if d == digest then table.insert(out, 2) else table.insert(out, 19) end
  else
    local h = redis.call('GET', prefix .. guid)
    if h then
      if h == digest then table.insert(out, 2) else table.insert(out, 19) end
    elseif age > max_age then
      table.insert(out, 18)
    else
      redis.call('HSET', KEYS[2], guid, ARGV[i + 4])
      redis.call('HSET', KEYS[3], guid, digest .. '|' .. now .. '|' .. ARGV[i + 3])
      redis.call('RPUSH', KEYS[1], guid)
      redis.call('SET', prefix .. guid, digest, 'PX', retention)
      table.insert(out, 1)
    end
  end
  i = i + 5
end
return out
"""

CLAIM = """
-- KEYS: ready, body, meta, count, out(node). ARGV: n, now ms.
-- Moves up to n ready messages to the node's deliveries, counting the delivery.
-- Returns guid, payload, meta, count for each.
local out = {}
for _ = 1, tonumber(ARGV[1]) do
  local guid = redis.call('LPOP', KEYS[1])
  if not guid then break end
  local body = redis.call('HGET', KEYS[2], guid)
  if body then
    local count = redis.call('HINCRBY', KEYS[4], guid, 1)
    redis.call('ZADD', KEYS[5], ARGV[2], guid)
    table.insert(out, guid)
    table.insert(out, body)
    table.insert(out, redis.call('HGET', KEYS[3], guid))
    table.insert(out, count)
  end
end
return out
"""

CONFIRM = """
-- KEYS: body, meta, count, out(node). ARGV: guids. Returns how many were confirmed.
local n = 0
for _, guid in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[4], guid) == 1 then
    redis.call('HDEL', KEYS[1], guid)
    redis.call('HDEL', KEYS[2], guid)
    redis.call('HDEL', KEYS[3], guid)
    n = n + 1
  end
end
return n
"""

REQUEUE = """
-- KEYS: ready, out(node). ARGV: guids in delivery order. Back to the head, in order.
local n = 0
for i = #ARGV, 1, -1 do
  if redis.call('ZREM', KEYS[2], ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n
"""

RECLAIM = """
-- KEYS: ready, out(dead node), consumers. ARGV: dead node id.
-- A dead node's deliveries go back to the head of the queue, oldest first.
local guids = redis.call('ZRANGE', KEYS[2], 0, -1)
for i = #guids, 1, -1 do
  redis.call('LPUSH', KEYS[1], guids[i])
end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[3], ARGV[1])
return #guids
"""

__all__ = ["CLAIM", "CONFIRM", "PUT", "RECLAIM", "REQUEUE"]

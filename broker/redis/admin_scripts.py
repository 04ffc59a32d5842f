"""The Lua scripts of the admin service on the Redis store (``admin``): PURGE, DELETE,
STATS and PEEK, each with the function that lays out its KEYS (and ARGV: ``script``).
Like ``scripts``, each touches one queue's keys only (one hash tag).
"""

from __future__ import annotations

from collections.abc import Iterable

from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.losses import DELETED_SEQ_TTL
from holdfast.broker.redis.script import Script, ScriptCall
from holdfast.broker.redis.scripts import ACCEPTED, EMIT

PURGE = Script(
    "PURGE",
    """
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
""",
)


def purge(queue: QueueKeys) -> ScriptCall:
    """PURGE ``queue``'s ready, delayed and unsynced messages."""
    return PURGE.call(
        [
            *(queue.ready, queue.delayed, queue.body, queue.meta),
            *(queue.count, queue.pickup, queue.bytes, queue.unsynced),
        ]
    )


DELETE = Script(
    "DELETE",
    """
-- KEYS: handles, body, seq, then every other key of the queue (ready, delayed, meta,
-- ..., each node's deliveries). ARGV: how long the write sequence stays, ms. Refused
-- (returns minus the open handles) while any node has the queue open; else deletes it
-- and returns how many messages went. The write sequence stays, expiring: a node reads
-- it back for an hour after it last saw it (``losses``), and one gone would read as a
-- Redis that went back; a queue made again under the URI goes on from it (SEQ).
local handles = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do handles = handles + tonumber(v) end
if handles > 0 then return -handles end
local n = redis.call('HLEN', KEYS[2])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
for i = 1, #KEYS do
  if i ~= 3 then redis.call('DEL', KEYS[i]) end
end
return n
""",
)


def delete(queue: QueueKeys, *, nodes: Iterable[str]) -> ScriptCall:
    """DELETE ``queue`` with every key it has, ``nodes``' deliveries included; its write
    sequence stays for ``DELETED_SEQ_TTL`` seconds."""
    return DELETE.call(
        [
            *(queue.handles, queue.body, queue.seq, queue.ready, queue.delayed, queue.meta),
            *(queue.count, queue.pickup, queue.bytes, queue.stats, queue.consumers),
            *(queue.leaving, queue.unsynced, *(queue.out(node) for node in nodes)),
        ],
        [DELETED_SEQ_TTL * 1000],
    )


STATS = Script(
    "STATS",
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
""",
)


def stats(queue: QueueKeys) -> ScriptCall:
    """STATS of ``queue``: its depths, counts and counters."""
    return STATS.call(
        [
            *(queue.ready, queue.delayed, queue.body, queue.bytes),
            *(queue.consumers, queue.handles, queue.stats, queue.meta),
        ]
    )


PEEK = Script(
    "PEEK",
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
""",
)


def peek(queue: QueueKeys, *, most: int, skip: int) -> ScriptCall:
    """PEEK at up to ``most`` ready messages of ``queue`` after the first ``skip``; the
    reply is guid, payload, meta, count rows."""
    return PEEK.call([queue.ready, queue.body, queue.meta, queue.count], [most, skip])


__all__ = ["DELETE", "PEEK", "PURGE", "STATS", "delete", "peek", "purge", "stats"]

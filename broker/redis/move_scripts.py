"""The Lua scripts of dead-letter moves and replays on the Redis store, each with the
function that lays out its KEYS and ARGV (``script``). Like ``scripts``, each touches
one queue's keys only (one hash tag).

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

from collections.abc import Iterable
from typing import NamedTuple

from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.lease_scripts import FENCE
from holdfast.broker.redis.script import Arg, Script, ScriptCall
from holdfast.broker.redis.scripts import DROP, EMIT

ADD = Script(
    "ADD",
    """
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
""",
)


class Move(NamedTuple):
    """A copy ADD puts in its target: its stride of ARGV, in this order."""

    guid: bytes
    move_id: str
    """Unique per move: the marker that makes a repeated move add nothing."""
    meta: str
    payload: bytes


def add(queue: QueueKeys, *, marker_ttl_ms: int, moves: Iterable[Move]) -> ScriptCall:
    """ADD the copies of ``moves`` to ``queue`` (each once: its marker lives
    ``marker_ttl_ms``)."""
    args: list[Arg] = [queue.moves, marker_ttl_ms]
    for move in moves:
        args += move
    return ADD.call([queue.ready, queue.body, queue.meta, queue.count, queue.bytes], args)


LEAVE = Script(
    "LEAVE",
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
""",
)


def leave(
    queue: QueueKeys,
    *,
    node: str,
    lease: str,
    now_ms: int,
    leaving: Iterable[tuple[bytes, str, str | None]],
) -> ScriptCall:
    """LEAVE: ``node``'s deliveries ``leaving`` (guid, reason, dead-letter queue or None
    to drop) are on their way out of ``queue`` from ``now_ms``."""
    args: list[Arg] = [now_ms]
    for guid, reason, target in leaving:
        args += [guid, f"{reason}|{target or ''}"]
    return LEAVE.call([queue.out(node), queue.leaving, lease], args)


LEAVING = Script(
    "LEAVING",
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
""",
)


def leaving(queue: QueueKeys, *, since_ms: int) -> ScriptCall:
    """LEAVING: the moves out of ``queue`` begun by ``since_ms``, unfinished; the reply is
    guid, payload, meta, count, ``<reason>|<target>`` rows."""
    return LEAVING.call([queue.leaving, queue.body, queue.meta, queue.count], [since_ms])


GONE = Script(
    "GONE",
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
""",
)


def gone(queue: QueueKeys, *, guids: Iterable[bytes]) -> ScriptCall:
    """GONE: the moves of ``guids`` out of ``queue`` are done; its copies go."""
    return GONE.call(
        [queue.body, queue.meta, queue.count, queue.leaving, queue.bytes, queue.pickup], guids
    )


STAY = Script(
    "STAY",
    """
-- KEYS: leaving, ready. ARGV: guids. Moves not to be made: back to the head, in order.
local n = 0
for i = #ARGV, 1, -1 do
  if redis.call('HDEL', KEYS[1], ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n
""",
)


def stay(queue: QueueKeys, *, guids: Iterable[bytes]) -> ScriptCall:
    """STAY: ``guids`` were taken to leave ``queue`` but stay, back at its head."""
    return STAY.call([queue.leaving, queue.ready], guids)


TAKE = Script(
    "TAKE",
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
""",
)


def take(queue: QueueKeys, *, now_ms: int) -> ScriptCall:
    """TAKE every ready and delayed message of the dead-letter queue ``queue`` to leave
    (a replay); the reply is guid, payload, meta, count rows."""
    return TAKE.call(
        [queue.ready, queue.delayed, queue.body, queue.meta, queue.count, queue.leaving],
        [now_ms],
    )


__all__ = [
    "ADD",
    "GONE",
    "LEAVE",
    "LEAVING",
    "STAY",
    "TAKE",
    "Move",
    "add",
    "gone",
    "leave",
    "leaving",
    "stay",
    "take",
]

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
ends in exactly one queue. ``ADD`` renames a dead letter whose GUID its queue holds
(``broker.moved_guids``) and leaves out a replay whose GUID its queue holds.
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
-- KEYS: ready, body, meta, count, bytes, pickup. ARGV: marker prefix, marker TTL ms,
-- then per message: guid, move id, meta, payload, mode, origin URI, renamed meta,
-- pickup deadline ms (0: none; a dead-letter notice's). Appends each message whose
-- move has not been done before. A GUID the queue holds already: mode
-- 'r' (a dead letter) appends it under the first dead_letter_guid(origin, guid, n)
-- the queue does not hold, with the renamed meta (x-original-guid); mode 'k' (a
-- replay) leaves it out. Returns status, guid per message: 0 moved before, 1 added,
-- 2 added renamed (its GUID), 3 held (not added).
local function derived(origin, guid, n)
  local hex = redis.sha1hex('holdfast-dead-letter/1:' .. origin .. '\\n' .. guid .. '\\n' .. n)
  local out = {}
  for j = 1, 16 do
    local b = tonumber(string.sub(hex, 2 * j - 1, 2 * j), 16)
    if j == 7 then b = b % 16 + 80 elseif j == 9 then b = b % 64 + 128 end
    out[j] = string.char(b)
  end
  return table.concat(out)
end
local prefix, ttl, out = ARGV[1], ARGV[2], {}
local i = 3
while i <= #ARGV do
  local guid, marker, meta, payload = ARGV[i], prefix .. ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local status = 0
  if redis.call('EXISTS', marker) == 0 then
    status = 1
    if redis.call('HEXISTS', KEYS[2], guid) == 1 then
      if ARGV[i + 4] == 'k' then
        status = 3
      else
        local n = 1
        local other = derived(ARGV[i + 5], guid, n)
        while redis.call('HEXISTS', KEYS[2], other) == 1 do
          n = n + 1
          other = derived(ARGV[i + 5], guid, n)
        end
        guid, meta, status = other, ARGV[i + 6], 2
      end
    end
    if status ~= 3 then
      redis.call('SET', marker, 1, 'PX', ttl)
      redis.call('HSET', KEYS[2], guid, payload)
      redis.call('HSET', KEYS[3], guid, meta)
      redis.call('HDEL', KEYS[4], guid)
      redis.call('RPUSH', KEYS[1], guid)
      redis.call('INCRBY', KEYS[5], #payload)
      if ARGV[i + 7] ~= '0' then redis.call('ZADD', KEYS[6], ARGV[i + 7], guid) end
    end
  end
  table.insert(out, status)
  table.insert(out, guid)
  i = i + 8
end
return out
""",
)

RENAME = "r"
"""A move whose copy takes a derived GUID if its queue holds its own (a dead letter)."""
KEEP_OUT = "k"
"""A move whose copy is left out if its queue holds its GUID (a replay)."""
ADDED_BEFORE, ADDED, ADDED_RENAMED, HELD = 0, 1, 2, 3
"""``ADD``'s status of each move."""


class Move(NamedTuple):
    """A copy ADD puts in its target: its stride of ARGV, in this order."""

    guid: bytes
    move_id: str
    """Unique per move: the marker that makes a repeated move add nothing."""
    meta: str
    payload: bytes
    mode: str
    """``RENAME`` or ``KEEP_OUT``."""
    origin: str
    """The queue it comes from (``RENAME``: the derived GUID's origin)."""
    renamed_meta: str
    """Its meta with ``x-original-guid`` (``RENAME``)."""
    pickup_ms: int
    """Its pickup deadline (ms; 0: none): a dead-letter notice's (``deadletter``)."""


def add(queue: QueueKeys, *, marker_ttl_ms: int, moves: Iterable[Move]) -> ScriptCall:
    """ADD the copies of ``moves`` to ``queue`` (each once: its marker lives
    ``marker_ttl_ms``); the reply is status, guid pairs."""
    args: list[Arg] = [queue.moves, marker_ttl_ms]
    for move in moves:
        args += move
    return ADD.call(
        [queue.ready, queue.body, queue.meta, queue.count, queue.bytes, queue.pickup], args
    )


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
-- KEYS: body, meta, count, leaving, bytes, pickup, stats. ARGV: guids.
-- Moves finished: the source's copy goes, and a dead letter (not a replay) is counted
-- under dead:<reason> here, by the one run that finds its move unfinished: two nodes
-- may finish one move (the reaper takes every unfinished move of a queue, another
-- node's in flight too), and a count made by each finisher ran ahead of the dead
-- letters. Returns the GUIDs whose move this run finished.
local out = {}
for _, guid in ipairs(ARGV) do
  local where = redis.call('HGET', KEYS[4], guid)
  if where then
    redis.call('HDEL', KEYS[4], guid)
    drop(guid)
    local reason = string.match(where, '^[^|]*|([^|]*)')
    if reason and reason ~= 'replay' then
      redis.call('HINCRBY', KEYS[7], 'dead:' .. reason, 1)
    end
    table.insert(out, guid)
  end
end
return out
""",
)


def gone(queue: QueueKeys, *, guids: Iterable[bytes]) -> ScriptCall:
    """GONE: the moves of ``guids`` out of ``queue`` are done; its copies go, its dead
    letters are counted; the reply is the GUIDs of the moves this call finished."""
    return GONE.call(
        [
            queue.body,
            queue.meta,
            queue.count,
            queue.leaving,
            queue.bytes,
            queue.pickup,
            queue.stats,
        ],
        guids,
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
    "ADDED",
    "ADDED_BEFORE",
    "ADDED_RENAMED",
    "GONE",
    "HELD",
    "KEEP_OUT",
    "LEAVE",
    "LEAVING",
    "RENAME",
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

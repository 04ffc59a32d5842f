"""The Lua scripts of a delivery's life on the Redis store: CLAIM, UNCLAIM, CONFIRM,
REQUEUE and RECLAIM, and the heartbeat's COUNTS (PUT is in ``put_scripts``; policies in
``policy_scripts``, moves in ``move_scripts``, the admin's in ``admin_scripts``), each
with the function that lays out its KEYS and ARGV (``script``).

Every script touches the keys of one queue only (one hash tag), so it runs on the
one cluster node that holds the queue; those that change a delivery take the node's
lease key last and refuse (``FENCED``) once it has lapsed (``lease``). A message's
meta is ``<digest>|<accepted_ms>|<properties JSON>``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.lease_scripts import FENCE
from holdfast.broker.redis.script import Script, ScriptCall
from holdfast.broker.redis.takes import CLAIMING, TAKE_KINDS, TOOK

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
  -- A deleted queue's sequence stays with a TTL (DELETE); a queue in use again keeps it
  -- for good, or a node that read it here would read 0 once it expired: a false loss.
  redis.call('PERSIST', key)
  if wrote then return redis.call('INCR', key) end
  return tonumber(redis.call('GET', key) or '0')
end
"""
"""Lua: move a queue's write sequence on (when ``wrote``) and return it."""

CLAIM = Script(
    "CLAIM",
    ACCEPTED
    + FENCE
    + SEQ
    + EMIT
    + TOOK
    + """
-- KEYS: ready, body, meta, count, out(node), pickup, stats, lease, seq, took.
-- ARGV: n, now ms, max deliveries (0: no limit), TTL cutoff ms (0: no TTL), token.
-- Moves up to n ready messages to the node's deliveries. One that may still be
-- delivered has its delivery counted; one past its delivery limit, the queue's TTL
-- or its pickup deadline is not (the node buries it). Returns guid, payload, meta,
-- count and the reason it is dead ('' if it is not) for each, then the write sequence.
-- A repeat of a claim (its token recorded: its reply was lost) takes nothing and
-- returns what the claim took that is still the node's (``takes``).
if fenced(KEYS[8]) then return redis.error_reply('FENCED: the node lease lapsed') end
local out, redelivered = {}, 0
local before = took_before(KEYS[10], ARGV[5])
if before then
  for i = 1, #before, 2 do
    local guid = before[i]
    local body = still_held(KEYS[5], KEYS[2], guid)
    if body then
      emit(out, guid, body, KEYS[3], KEYS[4])
      table.insert(out, before[i + 1])
    end
  end
  -- Moved on, as by the claim: the node compares it with what it saw before sending.
  table.insert(out, seq(KEYS[9], #out > 0))
  return out
end
local now, max_d, cutoff = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local took = {}
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
    table.insert(took, guid)
    table.insert(took, reason)
  end
end
if redelivered > 0 then redis.call('HINCRBY', KEYS[7], 'redelivered', redelivered) end
record_took(KEYS[10], ARGV[5], took)
table.insert(out, seq(KEYS[9], #out > 0))
return out
""",
)


def claim(
    queue: QueueKeys,
    *,
    node: str,
    lease: str,
    most: int,
    now_ms: int,
    max_deliveries: int,
    cutoff_ms: int,
    token: str,
) -> ScriptCall:
    """CLAIM up to ``most`` ready messages of ``queue`` into ``node``'s deliveries
    (fenced by ``lease``); 0 for ``max_deliveries`` or ``cutoff_ms`` is no limit;
    ``token`` names the claim for a repeat (``takes``). Its reply is ``Claimed`` rows,
    then the write sequence."""
    return CLAIM.call(
        [
            *(*queue.message_keys, queue.out(node), queue.pickup, queue.stats, lease),
            *(queue.seq, queue.took(node, CLAIMING)),
        ],
        [most, now_ms, max_deliveries, cutoff_ms, token],
    )


class Claimed(NamedTuple):
    """One message of a CLAIM (or SETTLE) reply, and why it is dead ('' if it is not)."""

    guid: bytes
    payload: bytes
    meta: bytes
    deliveries: int
    """Its delivery count (this claim's delivery counted, unless it is dead)."""
    reason: bytes | str


CONFIRM = Script(
    "CONFIRM",
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
""",
)


def confirm(queue: QueueKeys, *, node: str, lease: str, guids: Iterable[bytes]) -> ScriptCall:
    """CONFIRM ``guids``, delivered by ``node`` (fenced by ``lease``)."""
    return CONFIRM.call(
        [
            *(queue.body, queue.meta, queue.count, queue.out(node)),
            *(queue.bytes, queue.pickup, lease, queue.seq),
        ],
        guids,
    )


REQUEUE = Script(
    "REQUEUE",
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
""",
)


def requeue(queue: QueueKeys, *, node: str, lease: str, guids: Iterable[bytes]) -> ScriptCall:
    """REQUEUE ``guids`` (in delivery order), delivered by ``node``, at the head."""
    return REQUEUE.call([queue.ready, queue.out(node), lease], guids)


UNCLAIM = Script(
    "UNCLAIM",
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
""",
)


class Unclaimed(NamedTuple):
    """A claimed message UNCLAIM gives back: its GUID and pickup deadline (ms, 0: none)."""

    guid: bytes
    pickup_ms: int


def unclaim(
    queue: QueueKeys, *, node: str, lease: str, messages: Iterable[Unclaimed]
) -> ScriptCall:
    """UNCLAIM ``messages`` (in claim order) that ``node`` claimed and handed to nobody."""
    return UNCLAIM.call(
        [queue.ready, queue.count, queue.out(node), queue.pickup, queue.stats, lease],
        [value for message in messages for value in message],
    )


COUNTS = Script(
    "COUNTS",
    """
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
""",
)


def counts(queues: Iterable[QueueKeys], *, node: str) -> ScriptCall:
    """COUNTS of ``queues``, as ``node`` (whose own consumers are not counted) sees them;
    the reply is a ``QueueCounts`` row per queue."""
    keys: list[str] = []
    for queue in queues:
        keys += [queue.ready, queue.delayed, queue.bytes, queue.unsynced, queue.consumers]
    return COUNTS.call(keys, [node])


class QueueCounts(NamedTuple):
    """One queue's row of a COUNTS reply."""

    depth: int
    """Ready and delayed messages."""
    size: int
    """Payload bytes."""
    unsynced: int
    """Messages not yet on enough replicas (``durable``)."""
    others: int
    """Consumers attached on other nodes."""


RECLAIM = Script(
    "RECLAIM",
    """
-- KEYS: ready, out(dead node), consumers, handles, then its take records.
-- ARGV: dead node id. A dead node's deliveries go back to the head of the queue,
-- oldest first; its records of what it took go with it (``takes``).
local guids = redis.call('ZRANGE', KEYS[2], 0, -1)
for i = #guids, 1, -1 do
  redis.call('LPUSH', KEYS[1], guids[i])
end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
for i = 5, #KEYS do redis.call('DEL', KEYS[i]) end
return #guids
""",
)


def reclaim(queue: QueueKeys, *, node: str) -> ScriptCall:
    """RECLAIM the deliveries of the dead incarnation ``node`` of ``queue``."""
    takes = (queue.took(node, kind) for kind in TAKE_KINDS)
    return RECLAIM.call(
        [queue.ready, queue.out(node), queue.consumers, queue.handles, *takes], [node]
    )


__all__ = [
    "ACCEPTED",
    "CLAIM",
    "CONFIRM",
    "COUNTS",
    "DROP",
    "EMIT",
    "RECLAIM",
    "REQUEUE",
    "SEQ",
    "UNCLAIM",
    "Claimed",
    "QueueCounts",
    "Unclaimed",
    "claim",
    "confirm",
    "counts",
    "reclaim",
    "requeue",
    "unclaim",
]

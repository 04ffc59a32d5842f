"""The Lua scripts of queue policies on the Redis store: reject delays (DELAY, RELEASE),
the TTL and pickup deadlines (EXPIRE), the release guards (SETTLE), and the repair after
Redis went back in time (REPAIR); each with the function that lays out its KEYS and ARGV
(``script``). Like ``scripts``, each touches one queue's keys only (one hash tag).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.lease_scripts import FENCE
from holdfast.broker.redis.script import Arg, Script, ScriptCall
from holdfast.broker.redis.scripts import ACCEPTED, EMIT
from holdfast.broker.redis.takes import EXPIRING, SETTLING, TOOK

DELAY = Script(
    "DELAY",
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
""",
)


def delay(
    queue: QueueKeys, *, node: str, lease: str, due_ms: int, guids: Iterable[bytes]
) -> ScriptCall:
    """DELAY ``guids``, rejected from ``node``'s deliveries, until ``due_ms``."""
    return DELAY.call([queue.out(node), queue.delayed, lease], [due_ms, *guids])


RELEASE = Script(
    "RELEASE",
    """
-- KEYS: delayed, ready. ARGV: now ms. Due delayed messages go to the head, the
-- earliest due first.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for i = #due, 1, -1 do
  redis.call('ZREM', KEYS[1], due[i])
  redis.call('LPUSH', KEYS[2], due[i])
end
return #due
""",
)


def release(queue: QueueKeys, *, now_ms: int) -> ScriptCall:
    """RELEASE ``queue``'s delayed messages due by ``now_ms`` to its head."""
    return RELEASE.call([queue.delayed, queue.ready], [now_ms])


EXPIRE = Script(
    "EXPIRE",
    ACCEPTED
    + EMIT
    + FENCE
    + TOOK
    + """
-- KEYS: ready, body, meta, count, out(node), pickup, lease, took.
-- ARGV: now ms, TTL cutoff ms (0: no TTL), most messages, token.
-- Takes ready messages accepted at or before the cutoff and never-delivered ones past
-- their pickup deadline into the node's deliveries, for the node to bury. Returns
-- guid, payload, meta, count for each. Never-delivered messages are in acceptance
-- order, but a released one goes to the head and may be newer than those behind it:
-- the scan steps over delivered ones within the TTL and stops at the first
-- never-delivered one within it. A repeat (its token recorded: its reply was lost)
-- takes nothing and returns what is still the node's of what it took (``takes``).
if fenced(KEYS[7]) then return redis.error_reply('FENCED: the node lease lapsed') end
local out, took = {}, {}
local before = took_before(KEYS[8], ARGV[4])
if before then
  for i = 1, #before, 2 do
    local body = still_held(KEYS[5], KEYS[2], before[i])
    if body then emit(out, before[i], body, KEYS[3], KEYS[4]) end
  end
  return out
end
local now, cutoff, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local function take(guid)
  redis.call('ZREM', KEYS[6], guid)
  redis.call('ZADD', KEYS[5], now, guid)
  emit(out, guid, redis.call('HGET', KEYS[2], guid), KEYS[3], KEYS[4])
  table.insert(took, guid)
  table.insert(took, '')
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
record_took(KEYS[8], ARGV[4], took)
return out
""",
)


def expire(
    queue: QueueKeys,
    *,
    node: str,
    lease: str,
    now_ms: int,
    cutoff_ms: int,
    most: int,
    token: str,
) -> ScriptCall:
    """EXPIRE up to about ``most`` messages of ``queue`` accepted by ``cutoff_ms`` (0: no
    TTL) or past their pickup deadline, into ``node``'s deliveries for it to bury;
    ``token`` names the take for a repeat (``takes``). The reply is guid, payload, meta,
    count rows."""
    return EXPIRE.call(
        [*queue.message_keys, queue.out(node), queue.pickup, lease, queue.took(node, EXPIRING)],
        [now_ms, cutoff_ms, most, token],
    )


SETTLE = Script(
    "SETTLE",
    ACCEPTED
    + EMIT
    + FENCE
    + TOOK
    + """
-- KEYS: ready, body, meta, count, out(node), pickup, lease, took.
-- ARGV: now ms, TTL cutoff ms (0: no TTL), max deliveries (0: no limit), n, token.
-- The lifecycle's release guards (holdfast.broker.lifecycle.release) for the first n
-- ready messages, just put back at the head (a reject delay over, a dead node's
-- deliveries): one spent or past its TTL is taken into the node's deliveries for the
-- node to bury. Returns guid, payload, meta, count and the reason for each. A repeat
-- (its token recorded: its reply was lost) takes nothing and returns what is still the
-- node's of what it took (``takes``).
if fenced(KEYS[7]) then return redis.error_reply('FENCED: the node lease lapsed') end
local out, took = {}, {}
local before = took_before(KEYS[8], ARGV[5])
if before then
  for i = 1, #before, 2 do
    local body = still_held(KEYS[5], KEYS[2], before[i])
    if body then
      emit(out, before[i], body, KEYS[3], KEYS[4])
      table.insert(out, before[i + 1])
    end
  end
  return out
end
local now, cutoff, max_d = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
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
      table.insert(took, guid)
      table.insert(took, reason)
    end
  end
end
record_took(KEYS[8], ARGV[5], took)
return out
""",
)


def settle(
    queue: QueueKeys,
    *,
    node: str,
    lease: str,
    now_ms: int,
    cutoff_ms: int,
    max_deliveries: int,
    released: int,
    token: str,
) -> ScriptCall:
    """SETTLE the first ``released`` messages at ``queue``'s head: those spent or past
    the TTL go to ``node``'s deliveries for it to bury (0: no limit, no TTL); ``token``
    names the take for a repeat (``takes``). The reply is ``scripts.Claimed`` rows."""
    return SETTLE.call(
        [*queue.message_keys, queue.out(node), queue.pickup, lease, queue.took(node, SETTLING)],
        [now_ms, cutoff_ms, max_deliveries, released, token],
    )


REPAIR = Script(
    "REPAIR",
    """
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
""",
)


def repair(
    queue: QueueKeys, *, counts: Mapping[bytes, int], confirmed: Iterable[bytes]
) -> ScriptCall:
    """REPAIR ``queue`` after Redis went back: delivery counts raised back to ``counts``
    (per GUID), ``confirmed`` removed again. The reply is {raised, removed}."""
    args: list[Arg] = [len(counts)]
    for guid, count in counts.items():
        args += [guid, count]
    args += confirmed
    return REPAIR.call(
        [
            *(queue.body, queue.meta, queue.count, queue.ready),
            *(queue.bytes, queue.pickup, queue.delayed),
        ],
        args,
    )


__all__ = [
    "DELAY",
    "EXPIRE",
    "RELEASE",
    "REPAIR",
    "SETTLE",
    "delay",
    "expire",
    "release",
    "repair",
    "settle",
]

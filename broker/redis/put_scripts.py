"""The PUT script of the Redis store (dedup, depth limits and enqueue, atomic per queue
and frame) and PROMOTE, which makes messages stored under ``--redis-min-replicas``
deliverable once replicas have them (``durable``); each with the function that lays out
its KEYS and ARGV (``script``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.script import Arg, Script, ScriptCall
from holdfast.broker.redis.scripts import SEQ
from holdfast.proto import pb

PUT_STORED = -1
"""The PUT script's outcome for a PUT it stored."""
PUT_REPLAYED = -2
"""The PUT script's outcome for a replay of a GUID it knows with the same content."""
PUT_REFUSALS: dict[str, pb.Status] = {
    "CONFLICT": pb.STATUS_CONFLICT,
    "TOO_OLD": pb.STATUS_TOO_OLD,
    "QUEUE_FULL": pb.STATUS_QUEUE_FULL,
}
"""The PUT script's refusals, by the name its Lua uses: wire statuses from the generated
enum."""
PUT_OUTCOMES: dict[str, int] = {"STORED": PUT_STORED, "REPLAYED": PUT_REPLAYED, **PUT_REFUSALS}
"""Every outcome the PUT script returns, by the name its Lua uses (the Lua gets the
numbers from here): the refusals' wire statuses, and the two successes negative so that
they are no wire status."""
_REFUSED: dict[int, pb.Status] = {int(status): status for status in PUT_REFUSALS.values()}

PUT = Script(
    "PUT",
    "".join(f"local {name} = {value}\n" for name, value in PUT_OUTCOMES.items())
    + SEQ
    + """
-- KEYS: ready, body, meta, bytes, stats, pickup, unsynced, seq, consumers.
-- ARGV: history key prefix, retention ms, max age ms, now ms, max messages (0: no
-- limit), max bytes (0: no limit), hold ('1': new messages wait in unsynced until
-- replicas have them), then per PUT: guid, digest, age ms, properties JSON, payload,
-- pickup deadline ms (0: none).
-- Returns an outcome per PUT: STORED, REPLAYED, or the wire status CONFLICT,
-- TOO_OLD or QUEUE_FULL (the numbers are put in from Python: see PUT_OUTCOMES), then
-- 1 if any node has consumers of the queue (else 0), then the queue's write sequence.
local prefix, retention, max_age, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local max_n, max_b = tonumber(ARGV[5]), tonumber(ARGV[6])
local visible = KEYS[1]
if ARGV[7] == '1' then visible = KEYS[7] end
local n, b = 0, 0
if max_n > 0 then n = redis.call('HLEN', KEYS[2]) end
if max_b > 0 then b = tonumber(redis.call('GET', KEYS[4]) or '0') end
local out, added, added_bytes = {}, 0, 0
-- New messages' fields are written once a call, in chunks under Lua's C stack limit
-- (unpack of ~8,000 values fails); the history SET stays per PUT, so that a GUID
-- twice in one frame finds its first copy and is a replay.
local bodies, metas, guids = {}, {}, {}
local function each_chunk(command, key, values)
  for from = 1, #values, 4000 do
    redis.call(command, key, unpack(values, from, math.min(from + 3999, #values)))
  end
end
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
      bodies[#bodies + 1], bodies[#bodies + 2] = guid, payload
      metas[#metas + 1], metas[#metas + 2] = guid, digest .. '|' .. now .. '|' .. ARGV[i + 3]
      guids[#guids + 1] = guid
      redis.call('SET', prefix .. guid, digest, 'PX', retention)
      if ARGV[i + 5] ~= '0' then redis.call('ZADD', KEYS[6], ARGV[i + 5], guid) end
      n, b, added, added_bytes = n + 1, b + #payload, added + 1, added_bytes + #payload
      table.insert(out, STORED)
    end
  end
  i = i + 6
end
if added > 0 then
  each_chunk('HSET', KEYS[2], bodies)
  each_chunk('HSET', KEYS[3], metas)
  each_chunk('RPUSH', visible, guids)
  redis.call('INCRBY', KEYS[4], added_bytes)
  redis.call('HINCRBY', KEYS[5], 'accepted', added)
end
table.insert(out, redis.call('EXISTS', KEYS[9]))
table.insert(out, seq(KEYS[8], added > 0))
return out
""",
)


class PutArgs(NamedTuple):
    """One PUT as the PUT script reads it: its stride of ARGV, in this order."""

    guid: bytes
    digest: str
    age_ms: int
    properties: str
    """The properties as JSON (``{}`` for none)."""
    payload: bytes
    pickup_ms: int
    """The pickup deadline (ms; 0: none)."""


def put(
    queue: QueueKeys,
    *,
    retention_ms: int,
    max_age_ms: int,
    now_ms: int,
    max_messages: int,
    max_bytes: int,
    hold: bool,
    puts: Iterable[PutArgs],
) -> ScriptCall:
    """PUT ``puts`` into ``queue`` (0 for ``max_messages`` or ``max_bytes``: no limit);
    with ``hold`` new messages wait in its unsynced list until replicas have them. The
    reply is read by ``put_reply``."""
    args: list[Arg] = [
        *(queue.prefix + "g:", retention_ms, max_age_ms, now_ms),
        *(max_messages, max_bytes, 1 if hold else 0),
    ]
    for one in puts:
        args += one
    return PUT.call(
        [
            *(queue.ready, queue.body, queue.meta, queue.bytes),
            *(queue.stats, queue.pickup, queue.unsynced, queue.seq, queue.consumers),
        ],
        args,
    )


class PutReply(NamedTuple):
    """What the PUT script answered: an outcome per PUT, whether any node has
    consumers of the queue, and the write sequence."""

    outcomes: list[int]
    """``PUT_STORED``, ``PUT_REPLAYED`` or a refusal (``refusal_status``), per PUT."""
    consumed: bool
    """Some node has published a consumer count of the queue (``consumers_changed``):
    only then is a wake worth its PUBLISH, which every node's subscriber reads."""
    seq: int


def put_reply(raw: Sequence[Any]) -> PutReply:
    """The PUT script's reply, read."""
    return PutReply([int(code) for code in raw[:-2]], bool(int(raw[-2])), int(raw[-1]))


def refusal_status(outcome: int) -> pb.Status:
    """The wire status of a PUT outcome that is a refusal (``KeyError`` for a success)."""
    return _REFUSED[outcome]


PROMOTE = Script(
    "PROMOTE",
    """
-- KEYS: unsynced, ready. ARGV: a GUID replicas are known to have.
-- It and every GUID stored before it (replication keeps Redis's order) become
-- ready, in order. Returns how many.
local at = redis.call('LPOS', KEYS[1], ARGV[1])
if not at then return 0 end
local guids = redis.call('LRANGE', KEYS[1], 0, at)
redis.call('LTRIM', KEYS[1], at + 1, -1)
for _, guid in ipairs(guids) do redis.call('RPUSH', KEYS[2], guid) end
return #guids
""",
)


def promote(queue: QueueKeys, *, guid: bytes) -> ScriptCall:
    """PROMOTE ``guid`` and what ``queue`` stored before it from unsynced to ready."""
    return PROMOTE.call([queue.unsynced, queue.ready], [guid])


__all__ = [
    "PROMOTE",
    "PUT",
    "PUT_OUTCOMES",
    "PUT_REFUSALS",
    "PUT_REPLAYED",
    "PUT_STORED",
    "PutArgs",
    "PutReply",
    "promote",
    "put",
    "put_reply",
    "refusal_status",
]

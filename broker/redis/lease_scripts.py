"""The Lua of a node's lease: taking a fencing token, starting a lease, renewing it
(and the node's write mark with it), and the check every delivery script makes.

A node's lease key is ``hf:lease:{<incarnation>}`` (its value the fencing token, with
a TTL); its write mark ``hf:mark:{<incarnation>}`` shares the hash tag, so both are
one cluster slot and ``RENEW`` stays one atomic script. Each script has the function
that lays out its KEYS and ARGV (``script``).
"""

from __future__ import annotations

from holdfast.broker.redis.keys import lease_key, mark_key
from holdfast.broker.redis.script import Script, ScriptCall

NEXT_TOKEN = Script(
    "NEXT_TOKEN",
    """
-- KEYS: the fencing counter. ARGV: the highest token this node has seen.
-- A counter that went back (Redis lost data) is first raised to what the node saw,
-- so a token is never handed out twice.
local seen = tonumber(ARGV[1])
if tonumber(redis.call('GET', KEYS[1]) or '0') < seen then
  redis.call('SET', KEYS[1], seen)
end
return redis.call('INCR', KEYS[1])
""",
)


def next_token(counter: str, *, seen: int) -> ScriptCall:
    """NEXT_TOKEN from the fencing ``counter``, never at or below ``seen``."""
    return NEXT_TOKEN.call([counter], [seen])


LEASE_START = Script(
    "LEASE_START",
    """
-- KEYS: lease, mark. ARGV: token, lease ms, mark. A new incarnation's lease, and its
-- mark where the node's last one left off.
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
return 1
""",
)


def lease_start(incarnation: str, *, token: int, lease_ms: int, mark: int = 0) -> ScriptCall:
    """LEASE_START: ``incarnation``'s lease (``token``, for ``lease_ms``) and its first
    ``mark``."""
    return LEASE_START.call(
        [lease_key(incarnation), mark_key(incarnation)], [token, lease_ms, mark]
    )


RENEW = Script(
    "RENEW",
    """
-- KEYS: lease, mark. ARGV: token, lease ms, next mark.
-- Returns {1 if the lease was still this token's and is renewed (0 if it lapsed),
-- the mark as it was before ('' if none)}. The mark moves on only with the lease, so
-- a lapsed node never rewrites the keys its reaper deleted.
local stored = redis.call('GET', KEYS[2]) or ''
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('SET', KEYS[2], ARGV[3])
  return {1, stored}
end
return {0, stored}
""",
)


def renew(incarnation: str, *, token: int, lease_ms: int, mark: int) -> ScriptCall:
    """RENEW ``incarnation``'s lease if it is still ``token``'s, moving its mark to
    ``mark``; the reply is {renewed (1/0), the mark before}."""
    return RENEW.call([lease_key(incarnation), mark_key(incarnation)], [token, lease_ms, mark])


FENCE = """
local function fenced(lease)
  -- A node acts on deliveries only while its lease is alive. On Redis Cluster the
  -- lease is in another slot: the broker passes a key of the queue's own slot that
  -- is not a lease, and the node's own timer is the fence (see ``lease``).
  return string.find(lease, 'hf:lease:', 1, true) == 1 and redis.call('EXISTS', lease) == 0
end
"""
"""Lua: whether the node whose lease key is given has lost its lease (prefix of every
delivery script; they answer the error ``FENCED`` and change nothing)."""

FENCED = "FENCED"
"""The error a delivery script answers when the caller's lease has lapsed (the Lua
writes it out: ``redis.error_reply('FENCED: ...')``)."""

__all__ = [
    "FENCE",
    "FENCED",
    "LEASE_START",
    "NEXT_TOKEN",
    "RENEW",
    "lease_start",
    "next_token",
    "renew",
]

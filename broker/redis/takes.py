"""Takes that survive a lost reply: CLAIM, EXPIRE and SETTLE move messages into a node's
deliveries and answer with them; the node learns what it holds only from that answer.

A reply can be lost after the script ran: a socket timeout on a loaded Redis, a
connection cut on the way back, a primary that died after running it. The node's
client then sends the script again (``RedisClient.call`` retries an outage), and a
second run would take *other* messages, leaving the first run's in the node's
deliveries, known to nobody, until the node itself ended: neither delivered nor lost.

So each take carries a token, and records under it (``QueueKeys.took``, one record per
queue, node and kind of take) which messages it took and why each is dead ('' if it is
not). A run whose token matches the record is a repeat: it answers the recorded messages
that are still the node's deliveries, and takes nothing. The node keeps a take's token
until its reply arrived (``TakeTokens``): a take that failed for the whole retry window
lends its token to the next take of the same kind on that queue, which then hands out
what the lost one took before anything new.

A record lives ``RECORD_TTL_MS``, until the next take of its kind replaces it, or until
the node's deliveries are reclaimed (its end, ``RECLAIM``). Only the latest take of a
kind is recorded: enough for claims, which are serial per queue, also across sessions
(the node keeps its view of a queue while a claim is on its way:
``RedisRegistry.release``; found by the end-to-end test, where a new session's claim
replaced the record of a lost one), and for a queue's sweeps. A settle of the sweep and
one of the reaper may overlap; a repeat of the earlier then finds its record replaced,
takes afresh, and what it took waits for the node's end, as every lost take did before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from holdfast.broker.redis.script import ScriptCall
from holdfast.broker.store import StoreError

if TYPE_CHECKING:
    from holdfast.broker.redis.client import RedisClient

RECORD_TTL_MS = 600_000
"""How long a take's record is kept for a repeat: far beyond the client's retry window
(30 s by default), so a take that gave up is found again by the next one after an outage
of minutes. Past it, what a lost take held waits for the node's end (as before)."""

TOOK = (
    """
local RECORD_TTL_MS = """
    + str(RECORD_TTL_MS)
    + """
local function took_before(key, token)
  -- The GUIDs and reasons an earlier run of this take recorded, if this run repeats it.
  if redis.call('LINDEX', key, 0) ~= token then return nil end
  return redis.call('LRANGE', key, 1, -1)
end
local function record_took(key, token, took)
  -- took: guid, reason, guid, reason, ... (pushed in slices: unpack has a limit).
  redis.call('DEL', key)
  if #took == 0 then return end
  redis.call('RPUSH', key, token)
  for i = 1, #took, 1000 do
    redis.call('RPUSH', key, unpack(took, i, math.min(i + 999, #took)))
  end
  redis.call('PEXPIRE', key, RECORD_TTL_MS)
end
local function still_held(out_key, body_key, guid)
  -- A recorded message is answered again only while it is the node's and exists.
  return redis.call('ZSCORE', out_key, guid) and redis.call('HGET', body_key, guid)
end
"""
)
"""Lua: a take's record (``took_before``, ``record_took``) and the test a recorded
message passes to be answered again (``still_held``: its payload, or false)."""

CLAIMING = "claim"
"""The kind of take of ``scripts.CLAIM`` (a key suffix: ``QueueKeys.took``)."""
EXPIRING = "expire"
"""The kind of take of ``policy_scripts.EXPIRE``."""
SETTLING = "settle"
"""The kind of take of ``policy_scripts.SETTLE``."""
TAKE_KINDS = (CLAIMING, EXPIRING, SETTLING)
"""Every kind: a node's records of each are removed with its deliveries (``RECLAIM``)."""


class TakeTokens:
    """A node's take tokens: a new one per take, except that the token of a take whose
    reply never came is used again by the next take of its kind on its queue."""

    __slots__ = ("_lost", "_next")

    def __init__(self) -> None:
        # Unique in the process is enough: a record's key names the node incarnation.
        self._next = 0
        self._lost: dict[tuple[str, str], str] = {}

    def take(self, uri: str, kind: str) -> str:
        """The token for the next ``kind`` take of ``uri``."""
        lost = self._lost.pop((uri, kind), None)
        if lost is not None:
            return lost
        self._next += 1
        return str(self._next)

    def repeats(self, uri: str, kind: str) -> bool:
        """Whether the next ``kind`` take of ``uri`` repeats one whose reply was lost."""
        return (uri, kind) in self._lost

    def lost(self, uri: str, kind: str, token: str) -> None:
        """The take under ``token`` got no reply: the next one repeats it."""
        self._lost[(uri, kind)] = token

    async def run(
        self, client: RedisClient, uri: str, kind: str, make: Callable[[str], ScriptCall]
    ) -> Any:
        """Run the take ``make(token)`` lays out; its reply, or ``StoreError`` with the
        token kept for the next take of ``kind`` on ``uri``."""
        token = self.take(uri, kind)
        try:
            return await client.run(make(token))
        except StoreError:
            self.lost(uri, kind, token)
            raise


__all__ = ["CLAIMING", "EXPIRING", "RECORD_TTL_MS", "SETTLING", "TAKE_KINDS", "TOOK", "TakeTokens"]

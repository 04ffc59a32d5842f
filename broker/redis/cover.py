"""What the Redis store's GUID history covers, across nodes restarted with another
``--dedup-window``.

History keys expire on their own TTL, the retention (window + grace) in force when
each was written. Nodes restarted with a longer window would find only what the
shorter one kept, and take a replay older than it for a new message. One hash,
``hf:history-cover``, says since when the history is complete: each node, as it
starts, records its retention there; a longer one than recorded moves the
complete-since time to ``now - the old retention`` (what the old TTLs kept). The node
then answers TOO_OLD past that cover until its own window has filled
(``holdfast.broker.dedup.HistoryCover``, as the sqlite store's nodes do). A shorter
one is recorded as it is, so a later raise starts from it. Nodes running different
windows at once are not covered: the history is as complete as the shortest.
"""

from __future__ import annotations

from holdfast.broker.redis.client import RedisClient
from holdfast.broker.redis.script import Script

COVER_KEY = "hf:history-cover"
"""The hash of ``retention_ms`` and ``since_ms`` (wall clock, the store's clock)."""

COVER = Script(
    "history-cover",
    """
local retention = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local recorded = tonumber(redis.call('HGET', KEYS[1], 'retention_ms'))
local since = tonumber(redis.call('HGET', KEYS[1], 'since_ms')) or 0
if recorded and recorded < retention then
  since = math.max(since, now - recorded)
end
redis.call('HSET', KEYS[1], 'retention_ms', retention, 'since_ms', since)
return tostring(since)
""",
)


async def record_cover(client: RedisClient, retention_ms: int, now_ms: int) -> float | None:
    """Record this node's retention; return since when (seconds, wall clock) the
    history is complete, or None if it always was (no shorter retention recorded)."""
    raw = await client.run(COVER.call([COVER_KEY], [retention_ms, now_ms]))
    since_ms = int(float(raw.decode() if isinstance(raw, bytes) else raw))
    return since_ms / 1000 if since_ms > 0 else None


__all__ = ["COVER_KEY", "record_cover"]

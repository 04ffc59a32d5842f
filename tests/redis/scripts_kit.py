"""What the tests of the Redis scripts run directly share: a queue's keys of its own for
each test, and a script's Lua run with KEYS and ARGV as given (the ``db`` fixture, a
client of one redis-server per test module, is ``conftest``'s)."""

from __future__ import annotations

import uuid

import redis

from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.script import Script


def queue() -> QueueKeys:
    """The keys of a queue no other test uses."""
    return QueueKeys(f"hf://scripts/q-{uuid.uuid4().hex[:10]}")


def run(db: redis.Redis, script: Script, keys: list[str], args: list[str]) -> object:
    """Run ``script``'s Lua with KEYS and ARGV as given: these tests reach each script's
    rules directly, below the layout functions the broker calls (whose order
    ``test_script_layout.py`` checks against the same Lua)."""
    return db.eval(script.lua, len(keys), *keys, *args)


__all__ = ["queue", "run"]

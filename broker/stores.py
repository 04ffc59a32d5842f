"""Which store a ``--store`` value names, and opening it: the factory, kept apart from
the store interface (``store``) that every store implements."""

from __future__ import annotations

from dataclasses import dataclass

from holdfast.broker.dedup import DEFAULT_GRACE, DEFAULT_WINDOW
from holdfast.broker.redis.spec import parse_redis_spec, redact
from holdfast.broker.sqlite_store import SqliteStore
from holdfast.broker.store import MemoryStore, Store


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """A parsed ``--store`` value."""

    kind: str
    """``memory``, ``sqlite`` or ``redis``."""
    location: str = ""
    """Where a durable store keeps its data (empty for ``memory``)."""


STORE_KINDS = (
    "memory",
    "sqlite:PATH",
    "redis://HOST:PORT[/DB]",
    "rediss://HOST:PORT[/DB]",
    "redis+cluster://HOST:PORT[,HOST:PORT...]",
    "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]",
)
"""The ``--store`` values this broker understands."""


def parse_store_spec(spec: str) -> StoreSpec:
    """Parse a ``--store`` value; raise ``ValueError`` naming the accepted forms."""
    if spec == "memory":
        return StoreSpec("memory")
    if spec.startswith(("redis://", "rediss://", "redis+cluster://", "redis+sentinel://")):
        parse_redis_spec(spec)
        return StoreSpec("redis", spec)
    scheme, _, location = spec.partition(":")
    if scheme == "sqlite":
        if not location:
            raise ValueError("the sqlite store needs a file: sqlite:PATH")
        return StoreSpec("sqlite", location)
    raise ValueError(
        f"unknown store {redact(spec)!r} (scheme {scheme!r}): this broker supports "
        + ", ".join(STORE_KINDS)
    )


def open_store(
    spec: str,
    *,
    dedup_window: float = DEFAULT_WINDOW,
    sync: str = "full",
    dedup_grace: float = DEFAULT_GRACE,
) -> Store:
    """Create the store named by a ``--store`` value. A durable store prunes the GUID
    history older than ``dedup_window + dedup_grace`` (pass the broker's) and syncs its
    commits per
    ``sync`` (``full`` or ``normal``). Raises ``StoreError`` if it cannot be opened."""
    parsed = parse_store_spec(spec)
    if parsed.kind in ("memory", "redis"):
        # A Redis-backed broker keeps its queues in Redis (holdfast.broker.redis), not
        # through this interface: nothing is left for a Store to persist.
        return MemoryStore()
    if parsed.kind == "sqlite":
        return SqliteStore(
            parsed.location, dedup_window=dedup_window, dedup_grace=dedup_grace, sync=sync
        )
    raise AssertionError(f"parse_store_spec accepted {spec!r} but no store implements it")


__all__ = ["STORE_KINDS", "StoreSpec", "open_store", "parse_store_spec"]

"""A ``--store redis...`` value parsed, without importing redis-py: the broker checks
its ``--store`` before it knows which store it runs, and a memory or sqlite broker
never needs the Redis client (redis-py and the OpenTelemetry metrics SDK it loads
were about 100 ms of the 300 a broker took to import)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = ("redis", "rediss", "redis+cluster", "redis+sentinel")


@dataclass(frozen=True, slots=True)
class RedisSpec:
    """A parsed ``--store redis...`` value."""

    scheme: str
    nodes: tuple[tuple[str, int], ...]
    db: int = 0
    service: str = ""
    """With ``redis+sentinel://``: the name the Sentinels monitor the primary under."""

    @property
    def cluster(self) -> bool:
        """Whether this is a Redis Cluster."""
        return self.scheme == "redis+cluster"


def parse_redis_spec(spec: str) -> RedisSpec:
    """Parse ``redis://HOST:PORT[/DB]``, ``rediss://...``,
    ``redis+cluster://HOST:PORT[,HOST:PORT...]`` or
    ``redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` (Sentinels' addresses);
    ``ValueError`` saying what is wrong."""
    scheme, sep, rest = spec.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"a Redis store is one of {', '.join(s + '://' for s in SCHEMES)}")
    hosts, _, db_text = rest.partition("/")
    service = ""
    if scheme == "redis+sentinel":
        service, _, db_text = db_text.partition("/")
        if not service:
            raise ValueError(f"{spec!r}: name the monitored primary: .../SERVICE[/DB]")
    nodes = []
    for part in hosts.split(","):
        parsed = urlsplit("//" + part)
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or port is None:
            raise ValueError(f"{spec!r}: expected HOST:PORT, got {part!r}")
        nodes.append((parsed.hostname, port))
    if scheme in ("redis", "rediss") and len(nodes) != 1:
        raise ValueError(f"{spec!r}: one HOST:PORT (several with redis+cluster or +sentinel)")
    if db_text and (not db_text.isdigit() or scheme == "redis+cluster"):
        raise ValueError(f"{spec!r}: the database is a number, and a cluster has only 0")
    return RedisSpec(scheme, tuple(nodes), int(db_text or 0), service)


__all__ = ["SCHEMES", "RedisSpec", "parse_redis_spec"]

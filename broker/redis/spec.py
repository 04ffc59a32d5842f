"""A ``--store redis...`` value parsed, without importing redis-py: the broker checks
its ``--store`` before it knows which store it runs, and a memory or sqlite broker
never needs the Redis client (redis-py and the OpenTelemetry metrics SDK it loads
were about 100 ms of the 300 a broker took to import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

SCHEMES = ("redis", "rediss", "redis+cluster", "redis+sentinel")


@dataclass(frozen=True, slots=True)
class RedisSpec:
    """A parsed ``--store redis...`` value."""

    scheme: str
    nodes: tuple[tuple[str, int], ...]
    db: int = 0
    service: str = ""
    """With ``redis+sentinel://``: the name the Sentinels monitor the primary under."""
    username: str | None = field(default=None, repr=False)
    """The ACL user of ``USER:PASSWORD@`` (None: Redis's ``default`` user)."""
    password: str | None = field(default=None, repr=False)
    """The password of ``[USER]:PASSWORD@``: sent to Redis (every node of a cluster, the
    primary Sentinel names), never shown (``repr=False``, ``redact``)."""

    @property
    def cluster(self) -> bool:
        """Whether this is a Redis Cluster."""
        return self.scheme == "redis+cluster"


def redact(spec: str) -> str:
    """``spec`` with the credentials of a ``SCHEME://USER:PASSWORD@...`` address hidden
    (``redis://***@HOST:PORT``): for every message that shows a ``--store`` value."""
    scheme, sep, rest = spec.partition("://")
    if not sep or "@" not in rest:
        return spec
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


def _credentials(userinfo: str, spec: str) -> tuple[str | None, str | None]:
    """(user, password) of ``[USER]:PASSWORD`` (percent-encoded, as in any URL)."""
    user, colon, password = userinfo.partition(":")
    if not colon or not password:
        raise ValueError(
            f"{redact(spec)!r}: credentials are USER:PASSWORD@ or :PASSWORD@ before the host"
        )
    return unquote(user) or None, unquote(password)


def parse_redis_spec(spec: str) -> RedisSpec:
    """Parse ``redis://[[USER]:PASSWORD@]HOST:PORT[/DB]``, ``rediss://...``,
    ``redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]`` or
    ``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``
    (Sentinels' addresses; the credentials are the primary's);
    ``ValueError`` saying what is wrong (never showing the password)."""
    scheme, sep, rest = spec.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"a Redis store is one of {', '.join(s + '://' for s in SCHEMES)}")
    # The last "@", so a password may hold "@", "/" or ","; it is percent-decoded, as in
    # any URL (a "%" of its own is written %25).
    userinfo, at, rest = rest.rpartition("@")
    username, password = _credentials(userinfo, spec) if at else (None, None)
    shown = redact(spec)
    hosts, _, db_text = rest.partition("/")
    service = ""
    if scheme == "redis+sentinel":
        service, _, db_text = db_text.partition("/")
        if not service:
            raise ValueError(f"{shown!r}: name the monitored primary: .../SERVICE[/DB]")
    nodes = []
    for part in hosts.split(","):
        parsed = urlsplit("//" + part)
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or port is None:
            raise ValueError(f"{shown!r}: expected HOST:PORT, got {part!r}")
        nodes.append((parsed.hostname, port))
    if scheme in ("redis", "rediss") and len(nodes) != 1:
        raise ValueError(f"{shown!r}: one HOST:PORT (several with redis+cluster or +sentinel)")
    if db_text and (not db_text.isdigit() or scheme == "redis+cluster"):
        raise ValueError(f"{shown!r}: the database is a number, and a cluster has only 0")
    return RedisSpec(scheme, tuple(nodes), int(db_text or 0), service, username, password)


__all__ = ["SCHEMES", "RedisSpec", "parse_redis_spec", "redact"]

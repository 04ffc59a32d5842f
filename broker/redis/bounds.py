"""The ranges of the ``--redis-*`` flags, without importing redis-py (the broker checks
its flags before it knows which store it runs).

Each bound is one a working node needs, not a taste: a value past it used to be taken
and then failed in the running node (``--redis-lease inf`` overflowed the lease
keeper's timer in a tight loop; ``--redis-min-replicas 10**20`` made every PUT's
``WAIT`` an error, so no PUT was ever ACKed SUCCESS)."""

from __future__ import annotations

MIN_LEASE = 0.3
"""Seconds, the shortest ``--redis-lease``: the keeper renews every third of it (0.1 s
at this minimum), and each renewal must come back within 80 % of a third."""

MAX_LEASE = 3600.0
"""Seconds, the longest ``--redis-lease``: a node that dies holds its deliveries until
its peers reclaim them, ``lease * 4/3`` later; past an hour that is no longer a broker
that survives a node loss (and infinite or huge values overflow the keeper's timer)."""

MAX_RETRY = 3600.0
"""Seconds, the longest ``--redis-retry``: a PUT waits this long for its ACK while
Redis is away, and a starting node this long for its lease; past an hour nobody is
waiting for either (and infinite or huge values overflow the event loop's timers)."""

MAX_MIN_REPLICAS = 10_000
"""The largest ``--redis-min-replicas``: each replica is a client of its primary, and
Redis accepts at most ``maxclients`` (10,000 by default) of them, so a primary cannot
confirm more; a number past what Redis parses (a 64-bit integer) failed every PUT's
``WAIT``."""


def seconds_range(low: float, high: float, *, low_included: bool = True) -> str:
    """``0.3-3600 s`` or ``> 0 and <= 3600 s``: how an error states a range."""
    return f"{low:g}-{high:g} s" if low_included else f"> {low:g} and <= {high:g} s"


__all__ = ["MAX_LEASE", "MAX_MIN_REPLICAS", "MAX_RETRY", "MIN_LEASE", "seconds_range"]

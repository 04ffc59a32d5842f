"""Commands packed by hiredis on the broker's asyncio Redis connections.

redis-py's synchronous connections pack commands with ``hiredis.pack_command`` when
hiredis is installed; its asyncio connections (redis-py 8.1) always pack them in
Python, joining the growing buffer again for each argument. A PUT script call of 400
PUTs has 2,400 arguments: measured on the 2-core bench host, 3,326 µs to pack in
Python against 568 µs with hiredis (8.3 against 1.4 µs a PUT), the same bytes, while
the whole broker spent ~10 µs of CPU a message on Redis. These connection classes pack
with hiredis (as redis-py's own ``HiredisRespSerializer`` does); the rest of each
connection is redis-py's. ``use_hiredis`` swaps them into a client's pool in place of
redis-py's own classes, which keeps every other default of the client. Redis Cluster
keeps redis-py's packing: its client sets the connection class of the nodes it
discovers itself.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection
from redis.exceptions import DataError


def pack(*args: Any) -> list[bytes]:
    """``args`` as one Redis command, in the protocol's bytes. As redis-py does, a first
    argument with spaces (``"CONFIG GET"``) is sent as separate words."""
    first = args[0]
    if isinstance(first, str):
        args = (*first.encode().split(), *args[1:])
    elif b" " in first:
        args = (*first.split(), *args[1:])
    # hiredis's stub types its argument as a 1-tuple; it takes any number.
    words: Any = args
    try:
        return [hiredis.pack_command(words)]
    except TypeError:
        # It takes str, int, float and bytes only: the rare buffer becomes bytes here
        # rather than every argument being checked first (a quarter of the packing).
        words = tuple(bytes(a) if isinstance(a, bytearray | memoryview) else a for a in args)
    try:
        return [hiredis.pack_command(words)]
    except TypeError as error:
        raise DataError(str(error)) from None


class HiredisPacking:
    """Packs commands with hiredis (mixed into a redis-py asyncio connection class)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        """``args`` as one command (``pack``)."""
        return pack(*args)

    def pack_commands(self, commands: Any) -> list[bytes]:
        """Several commands (a pipeline), one after the other."""
        return [b"".join(pack(*command)[0] for command in commands)]


class HiredisConnection(HiredisPacking, Connection):
    """A plain TCP connection that packs with hiredis."""


class HiredisSSLConnection(HiredisPacking, SSLConnection):
    """A TLS connection that packs with hiredis."""


class HiredisSentinelConnection(HiredisPacking, SentinelManagedConnection):
    """A connection to the primary the Sentinels name, packing with hiredis."""


class HiredisSentinelSSLConnection(HiredisPacking, SentinelManagedSSLConnection):
    """A TLS connection to the primary the Sentinels name, packing with hiredis."""


_HIREDIS: dict[type[Any], type[Any]] = {
    Connection: HiredisConnection,
    SSLConnection: HiredisSSLConnection,
    SentinelManagedConnection: HiredisSentinelConnection,
    SentinelManagedSSLConnection: HiredisSentinelSSLConnection,
}


def use_hiredis(pool: Any) -> bool:
    """Make ``pool`` (a redis-py asyncio connection pool, before its first connection)
    open connections that pack with hiredis; False if its class is not one of redis-py's
    four TCP classes (it is left as it is)."""
    swapped = _HIREDIS.get(pool.connection_class)
    if swapped is None:
        return False
    pool.connection_class = swapped
    return True


__all__ = [
    "HiredisConnection",
    "HiredisPacking",
    "HiredisSSLConnection",
    "HiredisSentinelConnection",
    "HiredisSentinelSSLConnection",
    "pack",
    "use_hiredis",
]

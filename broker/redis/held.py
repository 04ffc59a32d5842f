"""Script calls on connections the store holds, past redis-py's asyncio pool.

Every PUT, claim and settle frame is one Lua script call, so a broker node makes a
call per frame, and when frames are small (a paced producer's are a millisecond of
PUTs, a few messages) what a call costs around its round trip is paid per message.
redis-py 8.1's asyncio client costs a lot there, measured on a 2-core host
(``bench/PROFILE.md``): a ``PING`` through ``Redis.execute_command`` takes 143 us of
the client's CPU, 347 Python calls, against 40 us for the same round trip on plain
asyncio streams. Per command it takes a connection from its pool under a lock, checks
it for unread data, records its observability counters on checkout and release,
wraps the call in its retry helper, and runs every send in a Task of its own
(``asyncio.wait_for``) to apply ``socket_timeout``.

``HeldConnections`` keeps redis-py's own connections (made by the client's pool, so
TLS, Sentinel and the hiredis packing are what the pool would give) out of that pool
and sends on them with ``send_command`` and ``read_response``: a script call of one
argument 147 -> 83 us of CPU. Their ``socket_timeout`` is off and one
``asyncio.timeout`` covers the send and the reply instead, a timer rather than a
Task. A connection whose exchange did not finish (a timeout, a lost link, a
cancelled call) is disconnected before it is used again, so no reply is ever read by
the wrong call; an error reply (``ResponseError``: NOSCRIPT, BUSY, a fenced node)
leaves it in step. A failure says whether the command may have reached Redis
(``NoReplyError``: it may have run, and may yet run, as a Redis stopped with
SIGSTOP runs what waits in its sockets once it resumes) or surely did not
(``NotSentError``: connecting failed, or Redis had closed the idle connection before
the send); the PUT path answers the two differently (``puts``). ``RedisClient.call``
still judges outages and retries, and bounds how many calls are in flight, which
bounds how many connections are held.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class NoReplyError(RedisConnectionError, RedisTimeoutError):
    """A command was sent (wholly or in part) and no reply came: it may have run."""


class NotSentError(RedisConnectionError):
    """A command failed before any of it was sent: it did not run."""


class HeldConnections:
    """Connections made by ``pool`` and kept for script calls (see the module
    docstring); one call at a time on each, as many as calls in flight."""

    def __init__(self, pool: ConnectionPool, timeout: float) -> None:
        self._pool = pool
        self.timeout = timeout
        """Seconds a call's send and reply may take before it is a timeout."""
        self._idle: list[AbstractConnection] = []
        self._all: list[AbstractConnection] = []

    @property
    def held(self) -> int:
        """Connections made so far (they are kept until ``close``)."""
        return len(self._all)

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply, as redis-py parses it; an error reply
        raises its ``ResponseError``; a failure once the command was sent (no reply
        within ``timeout``, a lost link) ``NoReplyError``, one before ``NotSentError``."""
        idle = self._idle
        connection = idle.pop() if idle else self._make()
        sent = False
        try:
            async with asyncio.timeout(self.timeout):
                if connection.is_connected and await connection.can_read():
                    # Unread bytes or an end of stream on an idle connection: Redis
                    # closed it (a restart, a kill) or it is out of step. Sent on it,
                    # a command could not run, yet its failure would look like a lost
                    # reply; a new connection tells the two apart.
                    await connection.disconnect(nowait=True)
                if not connection.is_connected:
                    # ``connect`` itself: ``send_command`` would connect without the
                    # subclass's ``connect``, and a Sentinel-managed connection would
                    # reach the default host:port instead of the primary the Sentinels
                    # name (redis-py 8.1; measured: a different Redis on this host).
                    await connection.connect()  # type: ignore[no-untyped-call]
                sent = True
                await connection.send_command(*args, check_health=False)
                reply = await connection.read_response()
        except ResponseError:
            raise  # the error reply was read whole: the connection is in step
        except TimeoutError:
            await connection.disconnect(nowait=True)
            if sent:
                raise NoReplyError(f"no reply from Redis within {self.timeout:g} s") from None
            raise NotSentError(f"could not connect to Redis within {self.timeout:g} s") from None
        except (RedisConnectionError, OSError) as error:
            await connection.disconnect(nowait=True)
            if sent:
                raise NoReplyError(f"the connection to Redis was lost: {error}") from None
            raise NotSentError(str(error)) from None
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        finally:
            idle.append(connection)
        return reply

    def _make(self) -> AbstractConnection:
        # redis-py's pool classes have no annotations.
        connection: AbstractConnection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        connection.socket_timeout = None  # ``execute``'s timeout covers it
        self._all.append(connection)
        return connection

    async def close(self) -> None:
        """Disconnect every held connection."""
        for connection in self._all:
            await connection.disconnect()
        self._all.clear()
        self._idle.clear()


__all__ = ["HeldConnections", "NoReplyError", "NotSentError"]

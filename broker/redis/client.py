"""redis-py for the store: connecting, the scripts, Redis outages and replicas.

A Redis outage is retried with back-off for up to ``retry_window`` seconds (30 by
default, ``--redis-retry``); past it the call raises ``StoreError``, or
``UnansweredError`` when some attempt was sent and never answered: that one may have
run, or may still run (a Redis stopped with SIGSTOP runs what waits in its sockets
when it resumes), so its outcome is unknown, never a failure (``puts`` re-sends such
a PUT until Redis answers). A script whose reply was lost with its connection may
have run, and is retried: PUT is deduplicated by GUID, moves are guarded by their
markers, confirms, requeues and delays act only on what is still where they expect
it, and a claim, expiry or settle repeated under its token answers what it took
(``takes``). Nothing is ACKed SUCCESS unless its script returned. This is the only
retry: redis-py's own (ten silent re-sends of a timed-out command by default, measured
6.6 s for a 0.2 s timeout) is off, so an outage is judged against ``retry_window``
here and logged. A ``BUSY`` reply (Redis is running another client's long script, such as a
big staged commit) is retried the same way: the call did not run. With
``redis+sentinel://`` each new connection asks the Sentinels for the primary, so the
retries reach a promoted replica after a failover.

With ``min_replicas`` each PUT waits for ``WAIT min_replicas``; a PUT that Redis took
but too few replicas confirmed in time is ACKed UNKNOWN (it is in the primary, and
may be lost by a failover), never SUCCESS.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode as SyncClusterNode
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel as SyncSentinel

from holdfast.broker.redis.held import HeldConnections, NoReplyError, NotSentError
from holdfast.broker.redis.lease_scripts import FENCED
from holdfast.broker.redis.packing import use_hiredis
from holdfast.broker.redis.script import Script, ScriptCall
from holdfast.broker.redis.spec import RedisSpec, parse_redis_spec
from holdfast.broker.redis.tls import RedisTls
from holdfast.broker.store import StoreError

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_RETRY_WINDOW = 30.0
"""Seconds a Redis outage is retried before calls fail with STORE_ERROR."""

RETRY_INITIAL = 0.05
RETRY_MAXIMUM = 1.0

SOCKET_TIMEOUT = 5.0
"""Seconds a reply may take before the call counts as failed (and is retried)."""

MAX_IN_FLIGHT = 64
"""Redis calls one node has in flight at once; the rest wait their turn in ``call``.
redis-py's asyncio pool opens a connection per concurrent command, up to 100 (per
node of a cluster), and past that *raises* ``MaxConnectionsError``, a
``ConnectionError``, which ``call`` cannot tell from an outage: under load (a PUT
script per frame, two broker nodes on one Redis) calls failed with "Too many
connections" and backed off for 50 ms or more each, and two nodes carried 0.62x
of one node's rate (``bench/redisscale.py``). Below the pool's bound, with room for
the subscriber's connection and the pipelines."""


class FencedError(StoreError):
    """A delivery script refused to act: this node's lease had lapsed (``lease``)."""


class UnansweredError(StoreError):
    """A call failed for its whole retry window after at least one attempt reached
    Redis unanswered: that attempt may have run (or run later), so what the call did is
    unknown."""


def _may_have_run(error: Exception) -> bool:
    """Whether a failed attempt may have reached Redis. The held connections know
    (``held``); redis-py's own paths (a cluster, the ``WAIT`` pipeline) say so only in
    their messages, and anything but a failure to connect counts as sent."""
    if isinstance(error, NoReplyError):
        return True
    if isinstance(error, NotSentError):
        return False
    return "connecting" not in str(error)


def _options(spec: RedisSpec, tls: RedisTls | None) -> dict[str, Any]:
    """The credentials of the ``--store`` URL (the primary's with Sentinel: the Sentinels
    are asked without) and, for ``rediss://``, the TLS settings."""
    options: dict[str, Any] = {}
    if spec.password is not None:
        options.update(username=spec.username, password=spec.password)
    if spec.scheme == "rediss":
        tls = tls if tls is not None else RedisTls()
        options.update(ssl=True, ssl_ca_certs=tls.ca, ssl_certfile=tls.cert, ssl_keyfile=tls.key)
    return options


def _connect(spec: RedisSpec, tls: RedisTls | None) -> Any:
    """redis-py's asyncio client of ``spec`` (one pool; a cluster client on a Cluster)."""
    common: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": 2.0}
    common.update(_options(spec, tls))
    if spec.cluster:
        # redis-py's retry stays here: it is what refreshes the slot map after a
        # failover (every script is repeat-safe, see the module's docstring).
        nodes = [ClusterNode(h, p) for h, p in spec.nodes]
        return RedisCluster(startup_nodes=nodes, **common)
    # Ours is the one retry elsewhere (see the module's docstring).
    common["retry"] = AsyncRetry(NoBackoff(), 0)
    if spec.scheme == "redis+sentinel":
        # The pool asks the Sentinels for the primary on every new connection, so
        # after a failover the retries of ``call`` reach the promoted replica.
        # redis-py's Sentinel constructor has no annotations.
        sentinels = Sentinel(list(spec.nodes), socket_timeout=2.0)  # type: ignore[no-untyped-call]
        client = sentinels.master_for(spec.service, db=spec.db, **common)
    else:
        host, port = spec.nodes[0]
        client = aioredis.Redis(host=host, port=port, db=spec.db, **common)
    use_hiredis(client.connection_pool)
    return client


class RedisClient:
    """One connection pool to Redis (or a cluster), the scripts, and retries."""

    def __init__(
        self,
        spec: RedisSpec,
        retry_window: float = DEFAULT_RETRY_WINDOW,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        tls: RedisTls | None = None,
    ) -> None:
        self.spec = spec
        self.retry_window = retry_window
        self.min_replicas = min_replicas
        self.replica_timeout = replica_timeout
        self.tls = tls
        self.redis: Any = _connect(spec, tls)
        self._held = (
            None if spec.cluster else HeldConnections(self.redis.connection_pool, SOCKET_TIMEOUT)
        )
        """Script calls' connections (``held``); a cluster's go through its client, which
        routes each call to its slot's node."""
        self._scripts: dict[str, Any] = {}
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.round_trips = 0
        self._wait_warned = -math.inf  # monotonic time of the last WAIT-failed warning
        """Redis calls made (for the bench: round trips per message)."""

    @property
    def where(self) -> str:
        """``HOST:PORT`` of the first node, for messages."""
        host, port = self.spec.nodes[0]
        return f"{host}:{port}"

    async def call(
        self,
        what: str,
        make: Callable[[], Awaitable[T]],
        *,
        deadline: float | None = None,
        unanswered: bool = False,
    ) -> T:
        """Run ``make()`` against Redis, retrying an outage with back-off until
        ``deadline`` (monotonic; by default ``retry_window`` from now); then
        ``StoreError``, or ``UnansweredError`` if an attempt (or, with ``unanswered``,
        an earlier call) reached Redis without a reply."""
        started = time.monotonic()
        if deadline is None:
            deadline = started + self.retry_window
        delay = RETRY_INITIAL
        warned = False

        def failed(message: str) -> StoreError:
            kind = UnansweredError if unanswered else StoreError
            return kind(f"redis store {self.where}: {what}{message}")

        while True:
            self.round_trips += 1
            try:
                async with self._in_flight:
                    return await make()
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                unanswered = unanswered or _may_have_run(error)
                if time.monotonic() + delay > deadline:
                    elapsed = time.monotonic() - started
                    raise failed(f" failed for {elapsed:.3g} s: {error}") from None
                if not warned:
                    log.warning("redis store %s unreachable (%s); retrying", self.where, error)
                    warned = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAXIMUM)
            except ResponseError as error:
                if str(error).startswith("BUSY") and time.monotonic() + delay <= deadline:
                    # Another client's long script (a big staged commit) holds Redis:
                    # ours has not run; it runs once that one is done.
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAXIMUM)
                    continue
                if str(error).startswith(FENCED):
                    raise FencedError(f"redis store {self.where}: {what}: {error}") from None
                raise failed(f": {error}") from None
            except RedisError as error:
                raise failed(f": {error}") from None

    def _registered(self, script: Script) -> Any:
        """redis-py's handle of ``script`` on this client: its SHA for ``run``, and the
        handle itself for ``run_replicated``'s pipeline (which loads it first)."""
        registered = self._scripts.get(script.name)
        if registered is None:
            registered = self._scripts[script.name] = self.redis.register_script(script.lua)
        return registered

    async def run(
        self, call: ScriptCall, *, deadline: float | None = None, unanswered: bool = False
    ) -> Any:
        """Run a script call (its module's layout function made it) with retries (as
        ``call``). A Redis that restarted has forgotten the scripts (NOSCRIPT): the
        call is sent again with the script's text."""
        script = self._registered(call.script)

        async def run() -> Any:
            try:
                return await self.send_script("EVALSHA", script.sha, call.keys, call.args)
            except NoScriptError:
                # This Redis does not know it (restarted, or a replica promoted since):
                # EVAL sends it whole, on the same connection, and Redis keeps it.
                return await self.send_script("EVAL", script.script, call.keys, call.args)

        return await self.call(call.script.name, run, deadline=deadline, unanswered=unanswered)

    async def send_script(
        self, command: str, script: str, keys: Sequence[Any], args: Sequence[Any]
    ) -> Any:
        """One ``EVALSHA`` (``script`` is the SHA) or ``EVAL`` (the Lua), sent once: on a
        held connection (``held``), or on a cluster through redis-py's client, which
        sends it to the node of its keys' slot. ``run`` adds the retries."""
        held = self._held
        if held is None:
            return await self.redis.execute_command(command, script, len(keys), *keys, *args)
        return await held.execute(command, script, len(keys), *keys, *args)

    async def command(self, *args: Any) -> Any:
        """One command whose reply needs no parsing beyond Redis's (a count, an integer),
        sent once, like ``send_script``: the per-frame ones (a wake's ``PUBLISH``, a
        counter's ``HINCRBY``). Use it inside ``call`` for the retries."""
        held = self._held
        if held is None:
            return await self.redis.execute_command(*args)
        return await held.execute(*args)

    async def run_replicated(
        self, call: ScriptCall, *, deadline: float | None = None, unanswered: bool = False
    ) -> tuple[Any, bool]:
        """Run a script call that stores (a PUT, a stage or a commit), with retries (as
        ``call``); with ``min_replicas``, ``WAIT`` for them on the same connection, in
        one pipeline. Returns the script's reply, and whether enough replicas confirmed
        it."""
        if not self.min_replicas:
            return await self.run(call, deadline=deadline, unanswered=unanswered), True
        script = self._registered(call.script)
        timeout_ms = round(self.replica_timeout * 1000)

        async def run_and_wait() -> list[Any]:
            # A pipeline does not reload forgotten scripts by itself: load first.
            await self.redis.script_load(script.script)
            pipe = self.redis.pipeline(transaction=False)
            await script(keys=call.keys, args=call.args, client=pipe)
            pipe.execute_command("WAIT", self.min_replicas, timeout_ms)
            result: list[Any] = await pipe.execute(raise_on_error=False)
            if isinstance(result[0], Exception):
                raise result[0]
            return result

        reply, acked = await self.call(
            call.script.name, run_and_wait, deadline=deadline, unanswered=unanswered
        )
        if isinstance(acked, Exception):
            # The script ran, so its PUTs are stored (held until replicas have them):
            # failing here would ACK them STORE_ERROR, which promises they were not.
            if time.monotonic() - self._wait_warned > 60:
                self._wait_warned = time.monotonic()
                log.warning("redis store %s: WAIT failed after a store: %s", self.where, acked)
            return reply, False
        return reply, int(acked) >= self.min_replicas

    def connect_sync(self, timeout: float) -> Any:
        """A blocking client of the same Redis with its own connection, whose calls
        time out after ``timeout`` seconds (the lease keeper's: ``lease``)."""
        # No retries inside redis-py (its default retries a timeout three times with
        # back-off: 7.6 s for a 0.4 s timeout, measured): the keeper judges time itself.
        common: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        common.update(_options(self.spec, self.tls))
        spec = self.spec
        if spec.cluster:
            # redis-py's sync cluster and Sentinel constructors have no annotations.
            nodes = [SyncClusterNode(h, p) for h, p in spec.nodes]  # type: ignore[no-untyped-call]
            return SyncRedisCluster(startup_nodes=nodes, **common)
        if spec.scheme == "redis+sentinel":
            sentinels = SyncSentinel(list(spec.nodes), socket_timeout=timeout)  # type: ignore[no-untyped-call]
            return sentinels.master_for(spec.service, db=spec.db, **common)  # type: ignore[no-untyped-call]
        host, port = spec.nodes[0]
        return redis.Redis(host=host, port=port, db=spec.db, **common)

    async def close(self) -> None:
        """Close the connections."""
        if self._held is not None:
            await self._held.close()
        await self.redis.aclose()


__all__ = [
    "DEFAULT_RETRY_WINDOW",
    "FencedError",
    "RedisClient",
    "RedisSpec",
    "UnansweredError",
    "parse_redis_spec",
]

"""Redis refusing a starting node for a reason no retry mends: a TLS certificate
problem (``tls``), credentials it does not take, a database it does not have, a
scheme that does not match the server (``redis+cluster://`` on a single Redis,
``redis://`` on a cluster node: ``wrong_kind``). These are configuration mistakes,
not outages: retrying them for ``--redis-retry`` seconds and then asking "is Redis
reachable?" sends the operator the wrong way, so the node stops at once with one line
naming the cause (``NodeLife.start``)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    RedisClusterException,
    ResponseError,
)

from holdfast.broker.redis.spec import RedisSpec
from holdfast.broker.redis.tls import tls_failure

PASSING = ("BUSY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN")
"""Error replies that pass by themselves (a long script, a Redis loading its data, a
replica without its primary, a cluster healing): outages, retried."""

NOT_A_CLUSTER = "cluster support disabled"
"""What a Redis without cluster support replies to CLUSTER commands ("This instance
has cluster support disabled")."""


def setup_failure(error: BaseException, spec: RedisSpec, has_cert: bool) -> str | None:
    """What ``error`` (from a starting node's first command) means if no retry can mend
    it, else None (an outage: retried). ``has_cert``: whether a client certificate was
    given (``tls_failure``). Never shows the password: Redis's replies do not hold it."""
    if spec.scheme == "rediss":
        failure = tls_failure(error, has_cert)
        if failure is not None:
            return failure
    while isinstance(error, RedisClusterException):
        # "Redis Cluster cannot be connected: ..." raised from the last node's error:
        # a refusal there (all nodes share the credentials) is one, a node down is not.
        # That error may itself be redis-py's "Cluster mode is not enabled on this
        # node", raised while handling the node's reply to CLUSTER SLOTS (its context):
        # the reply says why (no cluster support, or a user not granted the command).
        underneath = error.__cause__ or error.__context__
        if underneath is None:
            break
        error = underneath
    text = str(error)
    if isinstance(error, AuthenticationError):
        if spec.password is None:
            return (
                f"Redis requires a password: give it in --store ({spec.scheme}://:PASSWORD@"
                "HOST:PORT, or USER:PASSWORD@ for an ACL user)"
            )
        return f"Redis refused the user and password of --store ({text})"
    if isinstance(error, (AuthorizationError, NoPermissionError)):
        return f"Redis refused the user of --store ({text})"
    if isinstance(error, ResponseError) and not text.startswith(PASSING):
        if spec.cluster and NOT_A_CLUSTER in text:
            where = "that server" if len(spec.nodes) == 1 else "a server it names"
            return (
                f"{_shown(spec)} is not a Redis Cluster (cluster support is disabled on "
                f"{where}); use redis://"
            )
        if "DB index" in text:
            return f"Redis has no database {spec.db} (the /DB of --store): {text}"
        return f"Redis refused the connection: {text}"
    return None


def wrong_kind(probe: Any, spec: RedisSpec) -> str | None:
    """What is wrong if ``spec`` names one Redis (``redis://``, ``rediss://``) and
    ``probe``, a connected client of it, finds a Redis Cluster node: its first script
    would fail with MOVED (a key of another node's slot) or CROSSSLOT, retried as an
    outage. None if the server is no cluster node, or cannot say."""
    if spec.scheme not in ("redis", "rediss"):
        return None  # a cluster's client checks itself; Sentinels watch no cluster
    try:
        section = probe.info("cluster")
    except ResponseError:
        # INFO renamed away, or not granted to the ACL user of --store: this check is
        # a courtesy to a mistyped scheme, not worth refusing a working setup for.
        return None
    if section.get("cluster_enabled") != 1:
        return None
    return (
        f"{_shown(spec)} is a Redis Cluster node (cluster support is enabled on that "
        "server); use redis+cluster://"
    )


def _shown(spec: RedisSpec) -> str:
    """``spec`` as an address without its credentials or database, for messages."""
    hosts = (f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in spec.nodes)
    return f"{spec.scheme}://{','.join(hosts)}"


__all__ = ["NOT_A_CLUSTER", "setup_failure", "wrong_kind"]

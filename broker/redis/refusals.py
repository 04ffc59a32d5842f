"""Redis refusing a starting node for a reason no retry mends: a TLS certificate
problem (``tls``), credentials it does not take, a database it does not have. These
are configuration mistakes, not outages: retrying them for ``--redis-retry`` seconds
and then asking "is Redis reachable?" sends the operator the wrong way, so the node
stops at once with one line naming the cause (``NodeLife.start``)."""

from __future__ import annotations

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


def setup_failure(error: BaseException, spec: RedisSpec, has_cert: bool) -> str | None:
    """What ``error`` (from a starting node's first command) means if no retry can mend
    it, else None (an outage: retried). ``has_cert``: whether a client certificate was
    given (``tls_failure``). Never shows the password: Redis's replies do not hold it."""
    if spec.scheme == "rediss":
        failure = tls_failure(error, has_cert)
        if failure is not None:
            return failure
    while isinstance(error, RedisClusterException) and error.__cause__ is not None:
        # "Redis Cluster cannot be connected: ..." raised from the last node's error:
        # a refusal there (all nodes share the credentials) is one, a node down is not.
        error = error.__cause__
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
        if "DB index" in text:
            return f"Redis has no database {spec.db} (the /DB of --store): {text}"
        return f"Redis refused the connection: {text}"
    return None


__all__ = ["setup_failure"]

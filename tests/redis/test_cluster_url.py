"""A ``--store`` whose scheme does not match the server is a mistyped address, not an
outage: ``redis+cluster://`` on a single Redis was retried for --redis-retry (30 s)
with a traceback a second, then "is Redis reachable?"; ``redis://`` on a cluster node
failed its first script with MOVED, likewise retried. Both stop at once now."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.exceptions import NoPermissionError, RedisClusterException, ResponseError

from holdfast.broker.redis.refusals import setup_failure, wrong_kind
from holdfast.broker.redis.spec import parse_redis_spec
from tests.redis.refusal_kit import refused_at_once
from tests.support.redis_server import RedisServer, redis_cluster

pytestmark = pytest.mark.timeout(120)


def test_a_cluster_address_on_a_single_redis_stops_the_broker_at_once(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "a", aof=False) as a, RedisServer(tmp_path / "b", aof=False) as b:
        line = refused_at_once(
            f"redis+cluster://{a.address}",
            f"redis store {a.address}: redis+cluster://{a.address} is not a Redis Cluster "
            "(cluster support is disabled on that server); use redis://",
        )
        assert "Traceback" not in line
        # Several nodes: redis-py reports the last one it tried, whichever it is.
        refused_at_once(
            f"redis+cluster://{a.address},{b.address}",
            f"redis+cluster://{a.address},{b.address} is not a Redis Cluster "
            "(cluster support is disabled on a server it names); use redis://",
        )


def test_a_single_redis_address_on_a_cluster_node_stops_the_broker_at_once(
    tmp_path: Path,
) -> None:
    with redis_cluster(tmp_path, aof=False) as servers:
        for server in servers:
            refused_at_once(
                f"redis://{server.address}",
                f"redis store {server.address}: redis://{server.address} is a Redis Cluster "
                "node (cluster support is enabled on that server); use redis+cluster://",
            )


class _Probe:
    """A connected client whose ``INFO cluster`` answers ``reply`` (or raises it)."""

    def __init__(self, reply: dict[str, int] | Exception) -> None:
        self.reply = reply

    def info(self, section: str) -> dict[str, int]:
        assert section == "cluster"
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


def test_the_scheme_check_refuses_only_what_it_knows() -> None:
    plain = parse_redis_spec("redis://:pw@10.0.0.1:6379/3")
    on_cluster = wrong_kind(_Probe({"cluster_enabled": 1}), plain)
    assert on_cluster is not None and on_cluster.startswith("redis://10.0.0.1:6379 is a")
    assert wrong_kind(_Probe({"cluster_enabled": 0}), plain) is None
    # INFO not granted to the ACL user of --store: no reason to refuse a working setup.
    assert wrong_kind(_Probe(NoPermissionError("NOPERM info")), plain) is None
    # A cluster's own client finds out itself, by CLUSTER SLOTS.
    cluster = parse_redis_spec("redis+cluster://10.0.0.1:7000")
    assert wrong_kind(_Probe({"cluster_enabled": 1}), cluster) is None


def _folded(reply: ResponseError) -> RedisClusterException:
    """``reply`` to CLUSTER SLOTS as redis-py's cluster client raises it."""
    try:
        try:
            raise reply
        except ResponseError:
            raise RedisClusterException("Cluster mode is not enabled on this node")  # noqa: B904
    except RedisClusterException as inner:
        outer = RedisClusterException(f"Redis Cluster cannot be connected: {inner}")
        outer.__cause__ = inner
        return outer


def test_a_cluster_client_s_folded_reply_is_read_underneath() -> None:
    spec = parse_redis_spec("redis+cluster://10.0.0.1:7000")
    not_one = setup_failure(
        _folded(ResponseError("This instance has cluster support disabled")), spec, False
    )
    assert not_one is not None and "is not a Redis Cluster" in not_one
    # A user not granted CLUSTER SLOTS is refused as such, not as "no cluster".
    denied = setup_failure(_folded(NoPermissionError("NOPERM cluster|slots")), spec, False)
    assert denied is not None and denied.startswith("Redis refused the user of --store")
    # A cluster node still loading its data passes: retried.
    assert setup_failure(_folded(ResponseError("LOADING Redis is loading")), spec, False) is None

"""A Redis that asks for credentials (``requirepass``, an ACL user), and refusals no
retry mends: the password of ``--store redis://[USER]:PASSWORD@...`` was parsed and
dropped, so such a Redis, like a database index it does not have, looked like an
outage: one WARNING, --redis-retry (30 s) of retries, then "is Redis reachable?"."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from holdfast.sdk import Session
from tests.policies.support import Collector, post_all
from tests.redis import refusal_kit
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer, redis_cluster
from tests.support.sessions import FAST

pytestmark = pytest.mark.timeout(120)

URI = "hf://credentials/orders"
PASSWORD = "hunter2@/,"
"""With the characters a URL gives a meaning to ("@" ends the credentials)."""
QUOTED = "hunter2%40%2F%2C"


def test_a_broker_authenticates_to_redis_and_never_shows_the_password(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis", aof=False) as redis:
        # Set after start: the fixture's readiness check is a PING without credentials.
        assert redis.cli("ACL", "SETUSER", "holdfast", "on", f">{PASSWORD}", "~*", "&*", "+@all")
        assert redis.cli("CONFIG", "SET", "requirepass", PASSWORD) == "OK"
        user_url = f"redis://holdfast:{QUOTED}@{redis.address}/2"
        with BrokerProcess(["--store", user_url]) as broker:
            got = Collector()
            with Session(broker.address, options=FAST) as session:
                guids: list[uuid.UUID] = post_all(session, URI, [b"m%d" % i for i in range(200)])
                session.open_queue(URI, read=True, on_message=got)
                got.wait_for(200)
        assert Counter(got.guids()) == Counter({g: 1 for g in guids})
        assert "redis://***@" in broker.output
        assert "hunter2" not in broker.output
        # The default user's password alone (requirepass) works too.
        with BrokerProcess(["--store", f"redis://:{QUOTED}@{redis.address}"]) as broker:
            assert "listening on" in broker.output

        # A configuration mistake is no outage: the broker stops at once (not after
        # --redis-retry, 30 s by default) with one line naming it.
        for url, named in (
            (redis.url, "Redis requires a password: give it in --store"),
            (
                f"redis://:wrong-{QUOTED}@{redis.address}",
                "Redis refused the user and password of --store (invalid username-password",
            ),
            (
                f"redis://holdfast:{QUOTED}@{redis.address}/99999",
                "Redis has no database 99999 (the /DB of --store): DB index is out of range",
            ),
        ):
            refused_at_once(url, f"redis store {redis.address}: {named}")


def refused_at_once(url: str, named: str) -> None:
    """``refusal_kit.refused_at_once``, and the line shows no password."""
    assert "hunter2" not in refusal_kit.refused_at_once(url, named)


def test_a_cluster_refusing_the_credentials_stops_the_broker_at_once(tmp_path: Path) -> None:
    # redis-py's cluster client folds a node's refusal into "Redis Cluster cannot be
    # connected", which was retried for --redis-retry as an outage.
    with redis_cluster(tmp_path, aof=False) as servers:
        for server in servers:  # after the cluster is made: the bus asks no password
            assert server.cli("CONFIG", "SET", "requirepass", PASSWORD) == "OK"
        nodes = ",".join(s.address for s in servers[:2])
        first = servers[0].address
        with BrokerProcess(["--store", f"redis+cluster://:{QUOTED}@{nodes}"]) as broker:
            assert "listening on" in broker.output
        refused_at_once(
            f"redis+cluster://{nodes}",
            f"redis store {first}: Redis requires a password: give it in --store",
        )
        refused_at_once(
            f"redis+cluster://:wrong-{QUOTED}@{nodes}",
            f"redis store {first}: Redis refused the user and password of --store (invalid",
        )

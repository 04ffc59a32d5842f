"""The Redis store over TLS (``rediss://``): a ``redis-server`` of the test's own with a
TLS port and client certificates required (its default), certificates made with
``trustme``."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest
import trustme

from holdfast.broker.redis.tls import tls_failure
from holdfast.sdk import Session
from tests.policies.support import Collector, post_all
from tests.redis.refusal_kit import refused_at_once
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer, free_port
from tests.support.sessions import FAST

pytestmark = pytest.mark.timeout(120)

URI = "hf://tls/orders"


def _pem(blob: trustme.Blob, path: Path) -> str:
    blob.write_to_path(str(path))
    return str(path)


def test_a_broker_reaches_redis_over_tls_with_a_client_certificate(tmp_path: Path) -> None:
    ca, stranger = trustme.CA(), trustme.CA()
    server, client = ca.issue_cert("127.0.0.1"), ca.issue_cert("holdfast-broker")
    ca_file = _pem(ca.cert_pem, tmp_path / "ca.pem")
    tls_port = free_port()
    tls = (
        "--tls-port", str(tls_port),
        "--tls-cert-file", _pem(server.cert_chain_pems[0], tmp_path / "server.pem"),
        "--tls-key-file", _pem(server.private_key_pem, tmp_path / "server.key"),
        "--tls-ca-cert-file", ca_file,
    )  # fmt: skip
    client_flags = [
        "--redis-ca", ca_file,
        "--redis-cert", _pem(client.cert_chain_pems[0], tmp_path / "client.pem"),
        "--redis-key", _pem(client.private_key_pem, tmp_path / "client.key"),
    ]  # fmt: skip
    store = f"rediss://127.0.0.1:{tls_port}"
    with RedisServer(tmp_path / "redis", aof=False, extra=tls) as redis:
        with BrokerProcess(["--store", store, *client_flags]) as broker:
            got = Collector()
            with Session(broker.address, options=FAST) as session:
                guids: list[uuid.UUID] = post_all(session, URI, [b"m%d" % i for i in range(500)])
                session.open_queue(URI, read=True, on_message=got)
                got.wait_for(500)
        assert Counter(got.guids()) == Counter({g: 1 for g in guids})
        assert int(redis.cli("HLEN", "hf:{" + URI + "}:body")) == 0
        # A certificate problem is no outage: the broker stops at once (not after
        # --redis-retry, default 30 s) with one line naming it and the flag.
        stranger_ca = _pem(stranger.cert_pem, tmp_path / "stranger.pem")
        for flags, named in (
            (
                ["--redis-ca", stranger_ca, *client_flags[2:]],
                "Redis's certificate does not verify against --redis-ca (",
            ),
            (client_flags[:2], "Redis requires a client certificate: give --redis-cert"),
        ):
            refused_at_once(store, f"redis store 127.0.0.1:{tls_port}: TLS: {named}", *flags)


def test_tls_flags_need_a_rediss_store(tmp_path: Path) -> None:
    ca_file = _pem(trustme.CA().cert_pem, tmp_path / "ca.pem")
    broker = BrokerProcess(["--store", "redis://127.0.0.1:1", "--redis-ca", ca_file])
    with pytest.raises(RuntimeError):
        broker.start()
    broker.close()
    assert "need a rediss:// store" in broker.output


def test_a_connection_closed_in_the_handshake_without_a_client_certificate_is_named() -> None:
    """TLS 1.3: Redis's demand for a client certificate can lose the race with the
    client's first write, which then finds the connection closed (seen under load:
    the broker retried it as an outage for 30 s)."""
    eof = ConnectionError(
        "Error 8 while writing to socket. EOF occurred in violation of protocol (_ssl.c:2427)."
    )
    assert tls_failure(eof, has_cert=False) == (
        "TLS: Redis requires a client certificate: give --redis-cert and --redis-key"
    )
    assert tls_failure(eof, has_cert=True) is None  # then it may be an outage: retried

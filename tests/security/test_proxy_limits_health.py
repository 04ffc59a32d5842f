"""TLS and tokens between SDK, proxy and broker through a broker kill -9; per-session
limits refused with typed statuses while a bystander goes on; the health endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from holdfast.proto import pb
from holdfast.sdk import LimitExceededError, PermissionDeniedError, Session, SessionOptions
from tests.policies.support import Collector
from tests.security.conftest import Pki, token
from tests.support.metrics import metrics_address
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST
from tests.support.waiting import wait_until
from tests.support.wire_client import WireClient

URI = "hf://orders/secure"


@pytest.mark.timeout(120)
def test_sdk_proxy_broker_with_tls_and_tokens_through_a_broker_kill(
    pki: Pki, auth_file: Path, tmp_path: Path
) -> None:
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    upstream_token = tmp_path / "proxy.token"
    upstream_token.write_text(token("proxy") + "\n")
    store = f"sqlite:{tmp_path / 'b.db'}"
    with BrokerProcess([*tls, "--auth-file", str(auth_file), "--store", store]) as broker:
        proxy_args = [
            "--upstream", broker.address, *tls, "--auth-file", str(auth_file),
            "--upstream-ca", str(pki.ca), "--upstream-token-file", str(upstream_token),
        ]  # fmt: skip
        with ProxyProcess(proxy_args) as proxy:
            ca = str(pki.ca)
            writer = SessionOptions(reconnect=FAST.reconnect, tls_ca=ca, token=token("writer"))
            reader = SessionOptions(reconnect=FAST.reconnect, tls_ca=ca, token=token("reader"))
            with Session(proxy.address, options=writer) as session:
                queue = session.open_queue(URI, write=True)
                guids = [queue.post(b"m%d" % i) for i in range(1000)]
                broker.kill()
                guids += [queue.post(b"m%d" % i) for i in range(1000, 2000)]
                broker.restart()
                assert session.flush(timeout=60)
            with Session(proxy.address, options=reader) as session:
                # The proxy checks its clients' tokens itself (the broker sees the proxy's).
                with pytest.raises(PermissionDeniedError):
                    session.open_queue(URI, write=True, timeout=10)
                got = Collector()
                session.open_queue(URI, read=True, on_message=got)
                got.wait_for(2000, timeout=60)
    assert Counter(got.guids()) == Counter({guid: 1 for guid in guids})


@pytest.mark.timeout(60)
def test_open_queue_limits_are_typed_and_the_session_goes_on() -> None:
    with (
        BrokerProcess(["--max-open-queues", "3", "--new-queues-per-minute", "4"]) as broker,
        Session(broker.address, options=FAST) as session,
    ):
        handles = [session.open_queue(f"hf://lim/q{i}", write=True) for i in range(3)]
        with pytest.raises(LimitExceededError, match="3 open queues"):
            session.open_queue("hf://lim/q3", write=True, timeout=10)
        handles[0].close()
        session.open_queue("hf://lim/q4", write=True)  # the fourth new queue this minute
        handles[1].close()
        with pytest.raises(LimitExceededError, match="new queues a minute"):
            session.open_queue("hf://lim/q5", write=True, timeout=10)
        session.open_queue("hf://lim/q0", write=True)  # not new: allowed
        handles[2].post(b"still works")
        assert session.flush(timeout=10)


@pytest.mark.timeout(60)
def test_a_flooding_client_is_paused_and_told_while_a_bystander_goes_on() -> None:
    with BrokerProcess(["--frames-per-second", "50", "--confirm-errors-per-second", "5"]) as broker:
        flooder = WireClient(broker.address)
        flooder.hello()
        for _ in range(300):
            flooder.send(pb.ClientFrame(puts=pb.PutBatch()))
        error = flooder.recv("error", timeout=10).error
        assert (error.status, error.fatal) == (pb.STATUS_LIMIT_EXCEEDED, False)
        with Session(broker.address, options=FAST) as bystander:
            queue = bystander.open_queue("hf://lim/bystander", write=True)
            for i in range(2000):
                queue.post(b"b%d" % i)
            assert bystander.flush(timeout=20)  # its own budget: not held up by the flood
        # Confirming what it does not hold, over and over: the session is ended.
        confirmer = WireClient(broker.address)
        confirmer.hello()
        assert confirmer.open(1, "hf://lim/c", read=True).status == pb.STATUS_OK
        for i in range(20):
            confirmer.confirm(1, [i.to_bytes(16, "big")])
        errors = confirmer.recv_until(
            "error", lambda frames: bool(frames) and frames[-1].error.fatal
        )
        assert errors[-1].error.status == pb.STATUS_LIMIT_EXCEEDED
        flooder.close()
        confirmer.close()


@pytest.mark.timeout(60)
def test_health_and_readiness_endpoints() -> None:
    with BrokerProcess(["--metrics-listen", "127.0.0.1:0"]) as broker:
        base = f"http://{metrics_address(broker)}"
        for path, text in (("/healthz", "ok"), ("/readyz", "ready")):
            with urllib.request.urlopen(base + path, timeout=10) as answer:
                assert (answer.status, answer.read().decode().strip()) == (200, text)
        with urllib.request.urlopen(base + "/metrics", timeout=10) as answer:
            assert "holdfast_broker_sessions" in answer.read().decode()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/nothing", timeout=10)
        assert missing.value.code == 404
    with (
        BrokerProcess() as broker,
        ProxyProcess(["--upstream", broker.address, "--metrics-listen", "127.0.0.1:0"]) as proxy,
    ):
        base = f"http://{metrics_address(proxy)}"
        wait_until(lambda: _status(base + "/readyz") == 200, 10, "the proxy to be ready")
        broker.kill()
        wait_until(lambda: _status(base + "/readyz") == 503, 20, "the proxy to be unready")
        assert _status(base + "/healthz") == 200


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)

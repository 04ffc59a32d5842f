"""TLS, mTLS and tokens on the broker (issue #17): each refusal is a typed error, the
server does not crash, and a bystander client keeps working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import (
    AuthenticationError,
    PermissionDeniedError,
    RequestTimeoutError,
    Session,
    SessionOptions,
)
from holdfast.sdk.admin import AdminClient
from tests.policies.support import Collector
from tests.security.conftest import Pki, token
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST

pytestmark = pytest.mark.timeout(60)

URI = "hf://orders/new"


def options(pki: Pki | None, name: str | None, ca: Path | None = None) -> SessionOptions:
    """Fast-reconnecting session options trusting ``ca`` (default: the CA of ``pki``;
    no ``pki``: plaintext), with the token called ``name``."""
    trusted = ca if ca is not None else (pki.ca if pki is not None else None)
    return SessionOptions(
        reconnect=FAST.reconnect,
        tls_ca=str(trusted) if trusted is not None else None,
        token=token(name) if name is not None else None,
    )


class Bystander:
    """A well-behaved client that posts and consumes while others misbehave."""

    def __init__(self, address: str, opts: SessionOptions) -> None:
        self.session = Session(address, options=opts)
        self.queue = self.session.open_queue("hf://orders/bystander", write=True)
        self.got = Collector()
        self.session.open_queue("hf://orders/bystander", read=True, on_message=self.got)
        self.sent = 0

    def works(self) -> None:
        self.sent += 10
        for i in range(10):
            self.queue.post(b"b%d" % i)
        assert self.session.flush(timeout=15)
        self.got.wait_for(self.sent)

    def close(self) -> None:
        self.session.close()


def test_tls_with_tokens_serves_and_refuses_each_bad_client_typed(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    bystander = Bystander(tls_broker.address, options(pki, "writer"))
    try:
        bystander.works()
        # No token, a wrong token: the session fails at once with AuthenticationError.
        for opts in (options(pki, None), SessionOptions(tls_ca=str(pki.ca), token="not-a-token")):
            with (
                Session(tls_broker.address, options=opts) as session,
                pytest.raises(AuthenticationError),
            ):
                session.open_queue(URI, write=True, timeout=10)
            bystander.works()
        # A read-only token posting; a token of another domain opening a queue: only that
        # request is refused, the session goes on.
        with Session(tls_broker.address, options=options(pki, "reader")) as session:
            with pytest.raises(PermissionDeniedError, match="may not write domain 'orders'"):
                session.open_queue(URI, write=True, timeout=10)
            session.open_queue(URI, read=True, on_message=Collector(), timeout=10)
        with Session(tls_broker.address, options=options(pki, "billing")) as session:
            with pytest.raises(PermissionDeniedError, match="may not read domain 'orders'"):
                session.open_queue(URI, read=True, on_message=Collector(), timeout=10)
            with pytest.raises(PermissionDeniedError):
                session.has_workers(URI, timeout=10)
            session.open_queue("hf://billing/invoices", write=True, timeout=10)
        bystander.works()
        # A plaintext client, and one trusting another CA, never get a session: a typed
        # timeout naming the TLS failure.
        for opts, why in (
            (options(None, "writer"), "UNAVAILABLE"),
            (options(pki, "writer", ca=pki.other_ca), "andshake"),
        ):
            with (
                Session(tls_broker.address, options=opts) as session,
                pytest.raises(RequestTimeoutError, match=why),
            ):
                session.open_queue(URI, write=True, timeout=3)
        bystander.works()
    finally:
        bystander.close()


def test_the_admin_service_needs_an_admin_token(tls_broker: BrokerProcess, pki: Pki) -> None:
    with (
        AdminClient(tls_broker.address, token=token("writer"), tls_ca=str(pki.ca)) as admin,
        pytest.raises(PermissionDeniedError, match="not an admin token"),
    ):
        admin.queues()
    with (
        AdminClient(tls_broker.address, token="wrong-token-xx", tls_ca=str(pki.ca)) as admin,
        pytest.raises(AuthenticationError),
    ):
        admin.set_policy(URI, QueuePolicy(max_deliveries=2))
    with AdminClient(tls_broker.address, token=token("admin"), tls_ca=str(pki.ca)) as admin:
        admin.set_policy(URI, QueuePolicy(max_deliveries=2))
        assert admin.policy(URI).max_deliveries == 2
    done = subprocess.run(
        [
            sys.executable, "-m", "holdfast.admin", "--address", tls_broker.address,
            "--tls-ca", str(pki.ca), "--token", token("reader"), "queues",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert done.returncode == 7  # EXIT_PERMISSION
    assert done.stderr.count("\n") == 1 and "PERMISSION_DENIED" in done.stderr


def test_mutual_tls_requires_a_client_certificate(pki: Pki) -> None:
    args = [
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
        "--tls-client-ca", str(pki.ca),
    ]  # fmt: skip
    with BrokerProcess(args) as broker:
        certified = SessionOptions(
            reconnect=FAST.reconnect,
            tls_ca=str(pki.ca),
            tls_cert=str(pki.client_cert),
            tls_key=str(pki.client_key),
        )
        with Session(broker.address, options=certified) as session:
            session.open_queue(URI, write=True, timeout=10).post(b"x")
            assert session.flush(timeout=10)
        with (
            Session(broker.address, options=options(pki, None)) as session,
            pytest.raises(RequestTimeoutError),
        ):
            session.open_queue(URI, write=True, timeout=3)


def test_bad_security_files_are_one_line_errors(pki: Pki, tmp_path: Path) -> None:
    def broker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "holdfast.broker", "--listen", "127.0.0.1:0", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"tokens": [{"token": "short"}]}')
    cases = [
        (["--tls-cert", str(pki.server_cert)], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "/nonexistent", "--tls-key", str(pki.server_key)], "--tls-cert"),
        (["--tls-cert", str(bad_json), "--tls-key", str(pki.server_key)], "not a PEM file"),
        (["--auth-file", str(bad_json)], "token must be a string of 8"),
        (["--auth-file", "/nonexistent"], "cannot read auth file"),
    ]
    for args, text in cases:
        done = broker(*args)
        assert done.returncode == 2, done.stderr
        assert text in done.stderr and "Traceback" not in done.stderr

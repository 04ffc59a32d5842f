"""TLS failures are named, in the client's error and in the server's log (issue #34):
an unknown CA, an expired certificate, a certificate for another host, plaintext to a
TLS port, TLS to a plaintext port; and gRPC's own log lines come out in the server's
log format (one JSON object a line with ``--log-format json``)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from holdfast.proto.tls_failures import SERVER_FAILURES, name_failure
from holdfast.sdk import Session, SessionOptions
from holdfast.sdk.errors import RequestTimeoutError
from holdfast.server import grpc_logs
from holdfast.server.grpc_logs import relog
from tests.security.conftest import Pki
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def open_error(address: str, options: SessionOptions) -> str:
    """The message of the error that opening a queue ends with."""
    with (
        Session(address, options=options) as session,
        pytest.raises(RequestTimeoutError) as caught,
    ):
        session.open_queue("hf://d/q", write=True, timeout=2)
    return str(caught.value)


def tls_broker(cert: Path, key: Path, *extra: str) -> BrokerProcess:
    return BrokerProcess(
        ["--tls-cert", str(cert), "--tls-key", str(key), "--log-format", "json", *extra]
    )


def test_a_plaintext_client_of_a_tls_port_is_told_on_both_sides(pki: Pki) -> None:
    with tls_broker(pki.server_cert, pki.server_key) as broker:
        error = open_error(broker.address, SessionOptions())
        assert "the server speaks TLS on this port and this session does not" in error
        wait_until(lambda: "a client spoke plaintext" in broker.output, 10, "the server log")
        for line in broker.output.splitlines():  # gRPC's lines too: JSON, one a line
            entry = json.loads(line)
            assert {"time", "level", "logger", "message"} <= entry.keys()
        (named,) = {
            json.loads(line)["logger"]
            for line in broker.output.splitlines()
            if "spoke plaintext" in line
        }
        assert named == "holdfast.grpc"


def test_an_unknown_ca_is_named(pki: Pki) -> None:
    with tls_broker(pki.server_cert, pki.server_key) as broker:
        error = open_error(broker.address, SessionOptions(tls_ca=str(pki.other_ca)))
    assert "not signed by a CA in tls_ca (unknown CA)" in error


def test_a_certificate_for_another_host_is_named(tmp_path: Path) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("elsewhere.example")
    paths = [tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem")]
    ca.cert_pem.write_to_path(str(paths[0]))
    leaf.cert_chain_pems[0].write_to_path(str(paths[1]))
    leaf.private_key_pem.write_to_path(str(paths[2]))
    with tls_broker(paths[1], paths[2]) as broker:
        error = open_error(broker.address, SessionOptions(tls_ca=str(paths[0])))
    assert "not valid for the host name in the address" in error


@pytest.mark.parametrize(("starts", "ends"), [(-10, -1), (1, 10)], ids=["expired", "not-yet"])
def test_an_expired_or_not_yet_valid_certificate_is_named(
    tmp_path: Path, starts: int, ends: int
) -> None:
    ca_pem, cert_pem, key_pem = _dated_chain(starts, ends)
    paths = [tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem")]
    for path, data in zip(paths, (ca_pem, cert_pem, key_pem), strict=True):
        path.write_bytes(data)
    with tls_broker(paths[1], paths[2]) as broker:
        error = open_error(broker.address, SessionOptions(tls_ca=str(paths[0])))
    assert "TLS: the server's certificate has expired (or is not valid yet)" in error


def test_tls_to_a_plaintext_port_is_named(pki: Pki) -> None:
    with BrokerProcess() as broker:
        error = open_error(broker.address, SessionOptions(tls_ca=str(pki.ca)))
    assert "the server does not speak TLS on this port" in error


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A fresh handshake-failure throttle on a clock the test moves."""
    fake = FakeClock()
    monkeypatch.setattr(grpc_logs, "_handshakes", grpc_logs.Throttle(clock=fake))
    return fake


HANDSHAKE_LINE = (
    "I1125 07:11:38.528389    4189 ssl_transport_security.cc:2563] Handshake failed with "
    "error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
    "PEER_DID_NOT_RETURN_A_CERTIFICATE\n"
)


def test_a_client_retrying_a_failing_handshake_is_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    caplog.set_level(logging.DEBUG, logger="holdfast.grpc")
    plaintext = HANDSHAKE_LINE.replace("PEER_DID_NOT_RETURN_A_CERTIFICATE", "WRONG_VERSION_NUMBER")
    for _ in range(130):  # a misconfigured proxy retrying for a few seconds
        relog(HANDSHAKE_LINE)
        clock.now += 0.05
    relog(plaintext)  # another kind of failure is not held back by the first
    clock.now += grpc_logs.HANDSHAKE_LOG_INTERVAL
    relog(HANDSHAKE_LINE)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "a client sent no certificate" in messages[0] and "not logged" not in messages[0]
    assert "spoke plaintext" in messages[1]
    assert "a client sent no certificate" in messages[2]
    assert (
        f"(129 more like it not logged in {grpc_logs.HANDSHAKE_LOG_INTERVAL:g} s)" in (messages[2])
    )


def test_grpc_log_lines_keep_their_level_and_name_handshake_failures(
    caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    caplog.set_level(logging.DEBUG, logger="holdfast.grpc")
    relog(
        "I1125 07:11:38.528389    4189 ssl_transport_security.cc:2563] Handshake failed with "
        "error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
        "PEER_DID_NOT_RETURN_A_CERTIFICATE\n"
    )
    relog("E1125 07:11:38.528389    4189 chttp2_transport.cc:1] something broke\n")
    relog("not a glog line\n")
    relog("\n")
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert records[0][0] == logging.WARNING
    assert records[0][1].startswith("TLS handshake failed: a client sent no certificate")
    # A client that rejects the server's certificate stops before sending its own: the
    # server's line cannot blame a missing certificate alone.
    assert "or it does not trust this server's certificate" in records[0][1]
    assert records[1] == (logging.ERROR, "something broke [chttp2_transport.cc:1]")
    assert records[2] == (logging.WARNING, "not a glog line")
    assert len(records) == 3


def test_client_and_server_read_the_same_reason_each_their_way() -> None:
    line = "Handshake failed: SSL_ERROR_SSL: OPENSSL_internal:WRONG_VERSION_NUMBER"
    assert "does not speak TLS" in (name_failure(line) or "")
    assert "spoke plaintext" in (name_failure(line, SERVER_FAILURES) or "")
    assert name_failure("UNAVAILABLE: Connection refused") is None


def _dated_chain(starts: int, ends: int) -> tuple[bytes, bytes, bytes]:
    """A CA and a server certificate for 127.0.0.1 valid from ``starts`` to ``ends``
    days from now (PEM)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "expired-test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=30))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=starts))
        .not_valid_after(now + datetime.timedelta(days=ends))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return (
        ca.public_bytes(pem),
        leaf.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )

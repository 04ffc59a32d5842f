"""``holdfast certs dev DIR``: the files it writes, what is in them, that it keeps what
is there unless told ``--force``, and that its output runs mTLS on every hop:
SDK -> proxy -> broker, the SDK straight to the broker, and the admin command."""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from holdfast.admin.certs import DevCertificates
from holdfast.sdk import AckStatus, HoldfastError, Message, Session, SessionOptions
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

URI = "hf://dev/mtls"


def certs_dev(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "holdfast.admin", "certs", "dev", str(folder), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def public(path: Path) -> bytes:
    """The public key of a PEM private key, as DER."""
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def der(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_a_ca_a_server_and_a_client_certificate_with_private_keys(tmp_path: Path) -> None:
    folder = tmp_path / "made" / "here"
    done = certs_dev(folder, "--host", "db.example", "--host", "10.9.8.7")
    assert done.returncode == 0, done.stderr
    made = DevCertificates(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in made.paths())
    for key in (made.ca_key, made.server_key, made.client_key):
        assert mode(key) == 0o600, key
    for path in (made.ca_cert, made.server_cert, made.client_cert):
        assert mode(path) == 0o644, path
    ca, server, client = load(made.ca_cert), load(made.server_cert), load(made.client_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for leaf in (server, client):
        leaf.verify_directly_issued_by(ca)
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "db.example"}
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(ip) for ip in ("127.0.0.1", "::1", "10.9.8.7")
    }
    purpose = x509.ExtendedKeyUsage
    assert list(server.extensions.get_extension_for_class(purpose).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    assert list(client.extensions.get_extension_for_class(purpose).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    for cert, key in ((ca, made.ca_key), (server, made.server_key), (client, made.client_key)):
        assert der(cert) == public(key)
    # It says where each file goes.
    assert f"--tls-client-ca {made.ca_cert}" in done.stdout
    assert f"tls_cert='{made.client_cert}'" in done.stdout


def test_nothing_is_overwritten_without_force(tmp_path: Path) -> None:
    made = DevCertificates(tmp_path)
    assert certs_dev(tmp_path).returncode == 0
    before = {path: path.read_bytes() for path in made.paths()}
    refused = certs_dev(tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "--force" in refused.stderr
    assert {path: path.read_bytes() for path in made.paths()} == before
    # One file there is enough to refuse, and then nothing else is written either.
    other = tmp_path / "other"
    other.mkdir()
    (other / "client.key").write_bytes(b"mine")
    assert certs_dev(other).returncode == 1
    assert [p.name for p in other.iterdir()] == ["client.key"]
    # --force writes new ones, keys back at 0600 whatever their mode was.
    made.server_key.chmod(0o644)
    assert certs_dev(tmp_path, "--force").returncode == 0
    assert all(path.read_bytes() != before[path] for path in made.paths())
    assert mode(made.server_key) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_folder_that_cannot_be_used_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = certs_dev(blocker / "certs")
    assert (done.returncode, done.stderr.count("\n"), done.stdout) == (2, 1, "")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("host", ["", "a b", "-lead.example", "x..y", "a" * 64 + ".example"])
def test_a_host_that_is_no_name_is_refused_before_anything_is_written(
    tmp_path: Path, host: str
) -> None:
    done = certs_dev(tmp_path / "certs", "--host", "db.example", f"--host={host}")
    assert (done.returncode, done.stderr.count("\n"), done.stdout) == (2, 1, ""), done.stderr
    assert f"--host {host!r}" in done.stderr
    assert not (tmp_path / "certs").exists()


def test_wildcards_and_addresses_are_names(tmp_path: Path) -> None:
    done = certs_dev(tmp_path, "--host", "*.svc.example", "--host", "10.0.0.7", "--host", "h-1.")
    assert done.returncode == 0, done.stderr
    names = (
        load(DevCertificates(tmp_path).server_cert)
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert "*.svc.example" in names.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("10.0.0.7") in names.get_values_for_type(x509.IPAddress)


def test_its_output_runs_mtls_between_sdk_proxy_and_broker(tmp_path: Path) -> None:
    assert certs_dev(tmp_path).returncode == 0
    d = DevCertificates(tmp_path)
    serve = ["--tls-cert", str(d.server_cert), "--tls-key", str(d.server_key)]
    mtls = [*serve, "--tls-client-ca", str(d.ca_cert)]
    upstream = [
        "--upstream-ca", str(d.ca_cert),
        "--upstream-cert", str(d.client_cert), "--upstream-key", str(d.client_key),
    ]  # fmt: skip
    certified = SessionOptions(
        reconnect=FAST.reconnect,
        tls_ca=str(d.ca_cert),
        tls_cert=str(d.client_cert),
        tls_key=str(d.client_key),
    )
    with (
        BrokerProcess(mtls) as broker,
        ProxyProcess([*mtls, "--upstream", broker.address, *upstream]) as proxy,
    ):
        acks: list[AckStatus] = []
        with Session(proxy.address, options=certified) as session:
            queue = session.open_queue(URI, write=True, timeout=15)
            queue.post(b"through the proxy", on_ack=lambda ack: acks.append(ack.status))
            assert session.flush(timeout=15)
        with Session(broker.address, options=certified) as session:
            queue = session.open_queue(URI, write=True, timeout=15)
            queue.post(b"straight to the broker", on_ack=lambda ack: acks.append(ack.status))
            assert session.flush(timeout=15)
        assert acks == [AckStatus.SUCCESS, AckStatus.SUCCESS]
        got: list[bytes] = []

        def take(message: Message) -> None:
            got.append(message.payload)
            message.confirm()

        with Session(proxy.address, options=certified) as session:
            session.open_queue(URI, read=True, on_message=take, timeout=15)
            wait_until(lambda: len(got) == 2, 15, "both messages delivered over mTLS")
        assert sorted(got) == [b"straight to the broker", b"through the proxy"]
        # The admin command with the client certificate, after the command.
        admin = subprocess.run(
            [
                sys.executable, "-m", "holdfast.admin", "stats", URI, "--address",
                broker.address, "--tls-ca", str(d.ca_cert), "--tls-cert",
                str(d.client_cert), "--tls-key", str(d.client_key),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env={k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")},
        )  # fmt: skip
        assert admin.returncode == 0, admin.stderr
        # Without the client certificate, the proxy lets no one in.
        anonymous = SessionOptions(reconnect=FAST.reconnect, tls_ca=str(d.ca_cert))
        with (
            Session(proxy.address, options=anonymous) as session,
            pytest.raises(HoldfastError),  # refused in the TLS handshake
        ):
            session.open_queue(URI, write=True, timeout=3)

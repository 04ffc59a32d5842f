"""``holdfast certs dev DIR``: certificates for TLS and mTLS on one development machine.

Writes, with the ``cryptography`` library:

- ``ca.crt``, ``ca.key``: a CA of its own (give ``ca.crt`` to every ``--tls-client-ca``,
  ``--upstream-ca`` and ``SessionOptions(tls_ca=...)``);
- ``server.crt``, ``server.key``: a server certificate for ``127.0.0.1``, ``::1`` and
  ``localhost`` (and each ``--host``), for ``--tls-cert``/``--tls-key`` of the broker
  and the proxy;
- ``client.crt``, ``client.key``: a client certificate, for the SDK
  (``SessionOptions(tls_cert=..., tls_key=...)``), the proxy's ``--upstream-cert`` /
  ``--upstream-key`` and the ``holdfast`` command's ``--tls-cert``/``--tls-key``.

Keys are P-256 EC keys, written with mode 0600; certificates are valid for
``VALID_DAYS``. Nothing is overwritten without ``force``: if any of the six files is
there, none is written. Each file is written to a temporary name and renamed, so a
file is never seen half-written. These are development certificates: the CA key lies
next to the certificates it signed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365
"""How long the certificates are valid (from an hour ago, for clocks that differ)."""
SERVER_HOSTS = ("127.0.0.1", "::1", "localhost")
"""The names the server certificate always holds."""
CLIENT_NAME = "holdfast-dev-client"
"""The client certificate's common name."""


@dataclass(frozen=True, slots=True)
class DevCertificates:
    """The six files ``holdfast certs dev`` writes in ``folder``."""

    folder: Path

    @property
    def ca_cert(self) -> Path:
        """The CA certificate: what every side trusts."""
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        """The CA's key (to sign more certificates; keep it to yourself)."""
        return self.folder / "ca.key"

    @property
    def server_cert(self) -> Path:
        """The server certificate (``--tls-cert`` of the broker and the proxy)."""
        return self.folder / "server.crt"

    @property
    def server_key(self) -> Path:
        """The server's key (``--tls-key``)."""
        return self.folder / "server.key"

    @property
    def client_cert(self) -> Path:
        """The client certificate (``SessionOptions.tls_cert``, ``--upstream-cert``)."""
        return self.folder / "client.crt"

    @property
    def client_key(self) -> Path:
        """The client's key (``SessionOptions.tls_key``, ``--upstream-key``)."""
        return self.folder / "client.key"

    def paths(self) -> list[Path]:
        """All six, certificates and keys."""
        return [
            self.ca_cert,
            self.ca_key,
            self.server_cert,
            self.server_key,
            self.client_cert,
            self.client_key,
        ]


class CertificatesExistError(FileExistsError):
    """Some of the files are already there and ``force`` was not given."""


class InvalidHostError(ValueError):
    """A ``--host`` is neither an IP address nor a DNS name: a certificate holding it
    would match no server name, so TLS would fail later with a less clear error."""


_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def check_host(host: str) -> None:
    """Raise ``InvalidHostError`` unless ``host`` is an IP address or a DNS name
    (labels of letters, digits and inner hyphens; ``*.`` first for a wildcard)."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    name = host[2:] if host.startswith("*.") else host
    labels = name.rstrip(".").split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise InvalidHostError(f"--host {host!r}: not an IP address or a DNS name")


def make_dev_certificates(
    folder: Path, *, hosts: Sequence[str] = (), force: bool = False
) -> DevCertificates:
    """Write a CA, a server and a client certificate with their keys in ``folder``
    (made if missing); ``hosts`` are extra names or IP addresses of the server
    certificate. Raises ``CertificatesExistError`` (nothing written) if a file is
    there and not ``force``, ``InvalidHostError`` (nothing written) for a host that
    is not an IP address or a DNS name, ``OSError`` if the folder cannot be used."""
    for host in hosts:
        check_host(host)
    made = DevCertificates(folder)
    existing = [path.name for path in made.paths() if path.exists()]
    if existing and not force:
        raise CertificatesExistError(
            f"{folder}: {', '.join(existing)} already there (--force overwrites)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Holdfast development CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        _leaf(ca, ca_key, server_key, "localhost", now, ExtendedKeyUsageOID.SERVER_AUTH)
        .add_extension(
            x509.SubjectAlternativeName(list(_alt_names([*SERVER_HOSTS, *hosts]))),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = (
        _leaf(ca, ca_key, client_key, CLIENT_NAME, now, ExtendedKeyUsageOID.CLIENT_AUTH)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(CLIENT_NAME)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    for path, cert in ((made.ca_cert, ca), (made.server_cert, server), (made.client_cert, client)):
        _write(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    for path, key in ((made.ca_key, ca_key), (made.server_key, server_key)):
        _write(path, _pem(key), 0o600)
    _write(made.client_key, _pem(client_key), 0o600)
    return made


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key), critical=False)
    )


def _leaf(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    name: str,
    now: datetime.datetime,
    purpose: x509.ObjectIdentifier,
) -> x509.CertificateBuilder:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    return (
        _builder(subject, ca.subject, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        .add_extension(authority, critical=False)
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _alt_names(hosts: Iterable[str]) -> Iterable[x509.GeneralName]:
    seen: set[str] = set()
    for host in hosts:
        if host in seen:
            continue
        seen.add(host)
        try:
            yield x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            yield x509.DNSName(host)


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a temporary file of ``mode`` beside ``path``, then rename it:
    a key is never readable by others, even for a moment, and never half-written."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, mode)
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def usage_text(made: DevCertificates) -> str:
    """What was written and where each file goes."""
    d = made
    return "\n".join(
        [
            f"wrote {d.folder}: {', '.join(path.name for path in d.paths())}",
            f"broker: holdfast-broker --tls-cert {d.server_cert} --tls-key {d.server_key} "
            f"--tls-client-ca {d.ca_cert}",
            f"proxy:  holdfast-proxy --tls-cert {d.server_cert} --tls-key {d.server_key} "
            f"--tls-client-ca {d.ca_cert} --upstream-ca {d.ca_cert} "
            f"--upstream-cert {d.client_cert} --upstream-key {d.client_key}",
            f"SDK:    SessionOptions(tls_ca='{d.ca_cert}', tls_cert='{d.client_cert}', "
            f"tls_key='{d.client_key}')",
            f"admin:  holdfast --tls-ca {d.ca_cert} --tls-cert {d.client_cert} "
            f"--tls-key {d.client_key} queues",
        ]
    )


__all__ = [
    "CLIENT_NAME",
    "SERVER_HOSTS",
    "VALID_DAYS",
    "CertificatesExistError",
    "DevCertificates",
    "make_dev_certificates",
    "usage_text",
]

"""Certificates (made here with trustme) and token files for the security tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.support.processes import BrokerProcess


def _grant(
    name: str, read: list[str], write: list[str], admin: bool = False, proxy: bool = False
) -> dict[str, Any]:
    return {
        "token": f"{name}-token-0001",
        "name": name,
        "read": read,
        "write": write,
        "admin": admin,
        "proxy": proxy,
    }


TOKENS = {
    "admin": _grant("admin", ["*"], ["*"], admin=True),
    "reader": _grant("reader", ["orders"], []),
    "writer": _grant("writer", ["orders"], ["orders"]),
    "billing": _grant("billing", ["billing"], ["billing"]),
    "proxy": _grant("proxy", ["*"], ["*"], proxy=True),
}


@dataclass(frozen=True)
class Pki:
    """PEM files: a CA, a server certificate for 127.0.0.1, a client certificate, and
    another CA that signed nothing the servers use."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@holdfast.test")
    paths = Pki(*(root / name for name in ("ca", "scert", "skey", "ccert", "ckey", "other")))
    ca.cert_pem.write_to_path(str(paths.ca))
    server.cert_chain_pems[0].write_to_path(str(paths.server_cert))
    server.private_key_pem.write_to_path(str(paths.server_key))
    client.cert_chain_pems[0].write_to_path(str(paths.client_cert))
    client.private_key_pem.write_to_path(str(paths.client_key))
    other.cert_pem.write_to_path(str(paths.other_ca))
    return paths


@pytest.fixture(scope="session")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.json"
    path.write_text(json.dumps({"tokens": list(TOKENS.values())}))
    return path


def token(name: str) -> str:
    """The token string of one of ``TOKENS``."""
    return str(TOKENS[name]["token"])


@pytest.fixture
def tls_broker(pki: Pki, auth_file: Path) -> Iterator[BrokerProcess]:
    """A broker with TLS and tokens."""
    args = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    with BrokerProcess([*args, "--auth-file", str(auth_file)]) as broker:
        yield broker

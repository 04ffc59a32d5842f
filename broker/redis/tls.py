"""How a broker node reaches a Redis that speaks TLS (``--redis-ca``, ``--redis-cert``,
``--redis-key``): a settings value of its own, so the Redis client needs nothing from the
broker's configuration module."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True, slots=True)
class RedisTls:
    """How a broker reaches a Redis that speaks TLS (``rediss://``): without a CA the
    system's CAs are trusted; a client certificate is needed when Redis asks for one
    (its default, ``tls-auth-clients yes``)."""

    ca: str | None = None
    """PEM CA that signed the Redis server's certificate (``--redis-ca``)."""
    cert: str | None = None
    """PEM client certificate (``--redis-cert``)."""
    key: str | None = None
    """PEM key of the client certificate (``--redis-key``)."""

    def __post_init__(self) -> None:
        _check(
            (self.cert is None) == (self.key is None), "--redis-cert and --redis-key go together"
        )
        for flag, path in (
            ("--redis-ca", self.ca),
            ("--redis-cert", self.cert),
            ("--redis-key", self.key),
        ):
            _check(path is None or os.path.isfile(path), f"{flag} {path}: no such file")

    @property
    def configured(self) -> bool:
        """Whether any of the three is set."""
        return self.ca is not None or self.cert is not None


_FAILURES: tuple[tuple[str, str], ...] = (
    (
        "CERTIFICATE_REQUIRED",
        "Redis requires a client certificate: give --redis-cert and --redis-key",
    ),
    (
        "CERTIFICATE_VERIFY_FAILED",
        "Redis's certificate does not verify against --redis-ca",
    ),
    (
        "UNKNOWN_CA",
        "Redis refused --redis-cert (not signed by a CA in its tls-ca-cert-file)",
    ),
    (
        "BAD_CERTIFICATE",
        "Redis refused --redis-cert (not signed by a CA in its tls-ca-cert-file)",
    ),
    (
        "WRONG_VERSION_NUMBER",
        "Redis does not speak TLS on this port (give its tls-port, or use redis://)",
    ),
)
"""(needle in the SSL error, what it means for a broker), first match wins."""


_CLOSED_IN_HANDSHAKE = ("EOF occurred in violation of protocol", "UNEXPECTED_EOF")
"""How a TLS 1.3 client may see a server's refusal of a missing client certificate: the
handshake completes on the client's side, and Redis's alert loses the race with the
first write, which finds the connection closed (timing decides which the client sees)."""


def tls_failure(error: BaseException, has_cert: bool = True) -> str | None:
    """What ``error`` (redis-py's, wrapping an ``ssl.SSLError``) means if it is a TLS
    failure that no retry can mend (a certificate or configuration problem), else None.
    ``has_cert``: whether a client certificate was given (without one, a connection
    Redis closes during the handshake is its demand for one)."""
    text = str(error)
    if not has_cert and any(needle in text for needle in _CLOSED_IN_HANDSHAKE):
        text = "CERTIFICATE_REQUIRED"
    for needle, meaning in _FAILURES:
        if needle in text:
            # OpenSSL's reason ("self-signed certificate in certificate chain") follows.
            _, _, detail = text.partition("certificate verify failed:")
            detail = detail.split("(_ssl.c", 1)[0].strip(" .")
            return f"TLS: {meaning} ({detail})" if detail else f"TLS: {meaning}"
    return None


__all__ = ["RedisTls", "tls_failure"]

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


__all__ = ["RedisTls"]

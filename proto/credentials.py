"""How a client's token travels on the wire: gRPC metadata ``authorization: Bearer <token>``.

Shared by the SDK (which sends it) and the servers (``holdfast.server.auth``, which read
it); what a token may do is the servers' business, not the wire's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

AUTHORIZATION = "authorization"
"""The gRPC metadata key a client's token travels in (``Bearer <token>``)."""

BEARER = "Bearer "
"""The prefix of the metadata value before the token."""


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of ``authorization: Bearer <token>`` in gRPC metadata, if any."""
    for key, value in metadata or ():
        if key == AUTHORIZATION and isinstance(value, str) and value.startswith(BEARER):
            return value[len(BEARER) :]
    return None


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata a client sends its token in (none without a token)."""
    return ((AUTHORIZATION, BEARER + token),) if token else ()


__all__ = ["AUTHORIZATION", "BEARER", "bearer_token", "token_metadata"]

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


TOKEN_RULE = "a token is printable ASCII without spaces"
"""What ``sendable_token`` checks, in the words every refusal of a token uses."""


def sendable_token(token: str) -> bool:
    """Whether gRPC metadata can carry ``token`` (``TOKEN_RULE``). gRPC checks only when
    a call starts, failing it ``INTERNAL: Invalid metadata`` with C-core lines on
    stderr, which a client then retries as an unreachable server: every user of a
    token checks it with this where it is given."""
    return all(" " < char < "\x7f" for char in token)


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of ``authorization: Bearer <token>`` in gRPC metadata, if any."""
    for key, value in metadata or ():
        if key == AUTHORIZATION and isinstance(value, str) and value.startswith(BEARER):
            return value[len(BEARER) :]
    return None


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata a client sends its token in (none without a token)."""
    return ((AUTHORIZATION, BEARER + token),) if token else ()


__all__ = [
    "AUTHORIZATION",
    "BEARER",
    "TOKEN_RULE",
    "bearer_token",
    "sendable_token",
    "token_metadata",
]

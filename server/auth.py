"""Tokens and what they may do: the ``--auth-file`` of the broker and the proxy.

The file is JSON::

    {"tokens": [{"token": "s3cret", "name": "orders-service",
                 "read": ["orders"], "write": ["orders", "audit"], "admin": false}]}

``read`` and ``write`` list the domains (``hf://<domain>/...``) the token may consume
from and post to; ``"*"`` means every domain. ``admin`` allows the admin service
(``holdfast`` command). The optional ``"proxy": true`` marks the token of a proxy: a
session with it whose Hello says it relays clients is limited as one proxy
(``holdfast.server.guard``), not as one client. Without ``--auth-file`` nothing is
checked (local development).

Clients send their token as gRPC metadata, ``authorization: Bearer <token>``, on the
session stream and on unary calls alike. A missing or unknown token ends the session
with ``STATUS_UNAUTHENTICATED`` (SDK: ``AuthenticationError``); an operation outside
the token's domains gets ``STATUS_PERMISSION_DENIED`` for that request only (SDK:
``PermissionDeniedError``). Refusals name the token's ``name`` and the domain, never
whether a queue exists. Tokens are compared in constant time, each against all.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from holdfast.proto.credentials import TOKEN_RULE, sendable_token
from holdfast.proto.validate import NAME_RULE, is_name, quote

EVERY_DOMAIN = "*"
MAX_TOKEN_BYTES = 4096


class AuthFileError(ValueError):
    """An ``--auth-file`` that cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Grant:
    """What one token may do."""

    name: str
    read: frozenset[str]
    write: frozenset[str]
    admin: bool = False
    proxy: bool = False
    """The token may carry a proxy's clients (the proxy limits each of them itself)."""

    def can_read(self, domain: str) -> bool:
        """Whether the token may consume from queues of ``domain``."""
        return EVERY_DOMAIN in self.read or domain in self.read

    def can_write(self, domain: str) -> bool:
        """Whether the token may post to queues of ``domain``."""
        return EVERY_DOMAIN in self.write or domain in self.write


class Authorizer:
    """The tokens of an auth file, and the grant each carries."""

    def __init__(self, grants: Mapping[str, Grant]) -> None:
        self._tokens = [(token.encode("utf-8"), grant) for token, grant in grants.items()]

    def __len__(self) -> int:
        return len(self._tokens)

    @classmethod
    def load(cls, path: str | Path) -> Authorizer:
        """Read an auth file; ``AuthFileError`` naming the problem in one line."""
        try:
            data: Any = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            raise AuthFileError(f"cannot read auth file {path}: {error.strerror}") from None
        except ValueError as error:
            raise AuthFileError(f"auth file {path} is not JSON: {error}") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: Any, where: str = "auth file") -> Authorizer:
        """Build from parsed JSON; ``AuthFileError`` if it is not the documented shape."""
        if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
            raise AuthFileError(f'{where}: expected {{"tokens": [...]}}')
        grants: dict[str, Grant] = {}
        for index, entry in enumerate(data["tokens"]):
            token, grant = _entry(entry, f"{where}: tokens[{index}]")
            if token in grants:
                raise AuthFileError(f"{where}: tokens[{index}] repeats a token")
            grants[token] = grant
        return cls(grants)

    def authenticate(self, token: str | None) -> Grant | None:
        """The grant of ``token``, or None for a missing or unknown one."""
        if not token:
            return None
        candidate = token.encode("utf-8", "replace")[:MAX_TOKEN_BYTES]
        found: Grant | None = None
        for known, grant in self._tokens:  # every one: the time says nothing
            if hmac.compare_digest(known, candidate):
                found = grant
        return found


def _entry(entry: Any, where: str) -> tuple[str, Grant]:
    if not isinstance(entry, dict):
        raise AuthFileError(f"{where}: expected an object")
    token, name = entry.get("token"), entry.get("name")
    if not isinstance(token, str) or not 8 <= len(token) <= MAX_TOKEN_BYTES:
        raise AuthFileError(f"{where}: token must be a string of 8-{MAX_TOKEN_BYTES} characters")
    if not sendable_token(token):  # no client could send it: an entry that never matches
        raise AuthFileError(f"{where}: token: {TOKEN_RULE}")
    if not isinstance(name, str) or not name:
        raise AuthFileError(f"{where}: name must be a non-empty string")
    admin, proxy = entry.get("admin", False), entry.get("proxy", False)
    if not isinstance(admin, bool) or not isinstance(proxy, bool):
        raise AuthFileError(f"{where}: admin and proxy must be true or false")
    unknown = set(entry) - {"token", "name", "read", "write", "admin", "proxy"}
    if unknown:
        raise AuthFileError(f"{where}: unknown fields {', '.join(sorted(unknown))}")
    read = _domains(entry.get("read", []), f"{where}: read")
    write = _domains(entry.get("write", []), f"{where}: write")
    return token, Grant(name, read, write, admin, proxy)


def _domains(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(d, str) and d for d in value):
        raise AuthFileError(f"{where}: read and write must be lists of domain names")
    for domain in value:
        # A URI or a name with a space is compared with a queue's domain and never
        # matches: a grant that silently grants nothing.
        if domain != EVERY_DOMAIN and not is_name(domain):
            raise AuthFileError(
                f"{where}: {quote(domain)} is not a domain name ({NAME_RULE}), "
                f'nor "{EVERY_DOMAIN}" for every domain'
            )
    return frozenset(value)


__all__ = [
    "EVERY_DOMAIN",
    "AuthFileError",
    "Authorizer",
    "Grant",
]

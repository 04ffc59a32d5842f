"""Which address to try next, and how long to wait first.

Shared by every shell around the session engine (the SDK's threads and the
proxy's asyncio upstream), so they fail over the same way:

- addresses are tried in the order given;
- after an established connection drops, the same address is tried again at
  once, since most drops are transient;
- a failed attempt moves on to the next address at once; after a whole round
  of failures the policy waits a capped, jittered, growing back-off.
"""

from __future__ import annotations

import random

from holdfast.proto.validate import quote
from holdfast.sdk.backoff import Backoff
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.options import ReconnectOptions


def parse_addresses(address: str) -> list[str]:
    """Split ``"host:port[,host:port...]"`` into an ordered list of addresses."""
    if not isinstance(address, str):
        raise InvalidArgumentError(f"an address is a str, not {type(address).__name__}")
    addresses = [part.strip() for part in address.split(",") if part.strip()]
    if not addresses:
        raise InvalidArgumentError(f"no address in {quote(address)}")
    for entry in addresses:
        _check_address(entry)
    return addresses


def refuse_url_scheme(entry: str) -> None:
    """Refuse ``http://HOST:PORT`` and the like (``InvalidArgumentError``): every
    address the SDK, the servers and the command lines take is a bare ``HOST:PORT``."""
    if "://" in entry:
        raise InvalidArgumentError(
            f"address {quote(entry)} has a URL scheme: give HOST:PORT, e.g. 127.0.0.1:7701"
        )


def _check_address(entry: str) -> None:
    """Refuse what is not ``HOST:PORT``, saying what is wrong with it."""
    refuse_url_scheme(entry)
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not port:
        raise InvalidArgumentError(f"address {quote(entry)} is not HOST:PORT (no port)")
    if any(c.isspace() or c in "/?#@" for c in host):
        raise InvalidArgumentError(f"address {quote(entry)} has no valid host before the port")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidArgumentError(
            f"address {quote(entry)}: the port must be a number from 1 to 65535"
        )


class FailoverPolicy:
    """Chooses the next address and the delay before trying it."""

    def __init__(
        self, addresses: list[str], options: ReconnectOptions, rng: random.Random | None = None
    ) -> None:
        if not addresses:
            raise InvalidArgumentError("need at least one address")
        self.addresses = list(addresses)
        self._backoff = Backoff(options, rng)
        self._index = 0
        self._failures_in_round = 0

    @property
    def current(self) -> str:
        """The address to try next."""
        return self.addresses[self._index]

    def connection_ended(self, established: bool) -> float:
        """Record how the last attempt ended; return the seconds to wait before the next."""
        if established:
            self._backoff.reset()
            self._failures_in_round = 0
            return 0.0
        self._index = (self._index + 1) % len(self.addresses)
        self._failures_in_round += 1
        if self._failures_in_round < len(self.addresses):
            return 0.0
        self._failures_in_round = 0
        return self._backoff.next_delay()

"""Options as small documented value objects: queue, reconnect and session options."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from holdfast.proto.credentials import TOKEN_RULE, sendable_token
from holdfast.proto.limits import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_MAX_UNCONFIRMED_BYTES,
    DEFAULT_MAX_UNCONFIRMED_MESSAGES,
    MAX_BATCH_BYTES,
)
from holdfast.sdk.errors import InvalidArgumentError

DEFAULT_ADDRESS = "127.0.0.1:7701"
"""Where a session connects when neither an address nor ``$HOLDFAST_ADDRESS`` is given."""


def default_address() -> str:
    """``$HOLDFAST_ADDRESS`` if set, else ``127.0.0.1:7701`` (the local sidecar proxy)."""
    return os.environ.get("HOLDFAST_ADDRESS") or DEFAULT_ADDRESS


MAX_SECONDS = 86_400.0
"""The longest duration a ``SessionOptions`` or ``ReconnectOptions`` field takes (a
day). Longer ones overflowed where they are used: gRPC's keepalive channel arguments
are 32-bit milliseconds (24.8 days), and a timer past ``threading.TIMEOUT_MAX`` or
``time_t`` raises; a keepalive, connection attempt or back-off of more than a day
helps no one. ``close_timeout`` is not bounded: like ``flush(timeout=inf)``, a huge one
means as long as it takes."""

TOKEN_ENV = "HOLDFAST_TOKEN"
"""Environment variable holding the token a session sends by default."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidArgumentError(message)


def _seconds(name: str, value: float) -> None:
    """``value`` in (0, MAX_SECONDS] (NaN and infinity refused), or an error naming
    ``name`` (the proxy's command line turns it into its flag)."""
    _require(
        0 < value <= MAX_SECONDS,
        f"{name} must be > 0 and at most {MAX_SECONDS:g} seconds, not {value!r}",
    )


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """Consumer flow control for one queue handle.

    The broker stops PUSHing to this consumer while it holds this many unconfirmed
    messages or bytes. Setting ``max_unconfirmed_messages=0`` pauses delivery.
    """

    max_unconfirmed_messages: int = DEFAULT_MAX_UNCONFIRMED_MESSAGES
    """Most unconfirmed messages this consumer holds before delivery pauses."""
    max_unconfirmed_bytes: int = DEFAULT_MAX_UNCONFIRMED_BYTES
    """Most unconfirmed payload bytes this consumer holds before delivery pauses."""
    retry_delay: float = 0.5
    """When ``on_message`` raises, the message is rejected with requeue and comes back
    after ``min(retry_delay * 2**(delivery_count - 1), retry_delay_max)`` seconds (the
    queue's delivery limit, if its policy sets one, ends the loop in its dead-letter
    queue). Client-side only: the broker never sees it."""
    retry_delay_max: float = 30.0
    """The longest back-off of a message whose handler raised."""

    def retry_delay_for(self, delivery_count: int) -> float:
        """The back-off before redelivering a message whose handler raised on its
        ``delivery_count``-th delivery."""
        exponent = min(max(delivery_count - 1, 0), 32)
        return min(self.retry_delay * float(2**exponent), self.retry_delay_max)

    def __post_init__(self) -> None:
        _require(
            0 <= self.max_unconfirmed_messages < 2**32,
            "max_unconfirmed_messages must be in [0, 2**32)",
        )
        _require(0 <= self.max_unconfirmed_bytes < 2**64, "max_unconfirmed_bytes must be >= 0")
        _require(
            0 <= self.retry_delay <= self.retry_delay_max <= 3600,
            "retry delays must satisfy 0 <= retry_delay <= retry_delay_max <= 3600 seconds",
        )


@dataclass(frozen=True, slots=True)
class ReconnectOptions:
    """Capped, jittered exponential back-off between connection attempts.

    The delay after the n-th consecutive failed round over all addresses is
    ``min(maximum, initial * multiplier**n)``, scaled by a random factor in
    ``[1 - jitter, 1 + jitter]`` so that many clients do not reconnect in step.

    The default cap bounds what a reconnect adds to an outage: after the broker is
    back, the next attempt comes within ``maximum * (1 + jitter)`` = 0.24 s, and the
    restore and first ACK take 0.03-0.05 s more (``bench/recovery.py``), inside the
    0.3 s recovery budget: over 10 runs the stall exceeded the outage by 0.06-0.26 s.
    At 0.25 (a 0.30 s wait) it was 0.05-0.31 s, over budget in 2 of 7 runs. A client
    makes about five attempts a second while its broker is down.
    """

    initial: float = 0.05
    maximum: float = 0.2
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        _seconds("initial", self.initial)
        _seconds("maximum", self.maximum)
        _require(self.initial <= self.maximum, "need 0 < initial <= maximum")
        _require(1 <= self.multiplier < math.inf, "multiplier must be >= 1 and finite")
        _require(0 <= self.jitter < 1, "jitter must be in [0, 1)")


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """How a ``Session`` connects, detects dead links and buffers.

    Liveness is gRPC keepalive: a ping every ``keepalive_time`` seconds that must be
    answered within ``keepalive_timeout`` seconds, so a black-holed link is noticed
    within about their sum.
    """

    connect_timeout: float = 5.0
    """Seconds one connection attempt (TCP + Hello) may take before it is abandoned."""
    keepalive_time: float = 1.0
    """Seconds between gRPC keepalive pings."""
    keepalive_timeout: float = 2.0
    """Seconds a keepalive ping may go unanswered before the link is declared dead."""
    reconnect: ReconnectOptions = field(default_factory=ReconnectOptions)
    """Back-off between connection attempts."""
    high_watermark_bytes: int = 64 * 1024 * 1024
    """Outbound bytes not yet taken by the transport above which ``post()`` waits (5 s at most)."""
    max_batch_bytes: int = DEFAULT_BATCH_BYTES
    """Target size of one outbound frame; a single larger message travels alone."""
    max_disconnected_buffer_bytes: int | None = None
    """Optional bound on payload bytes buffered while not connected (default: none)."""
    close_timeout: float = 30.0
    """Seconds ``close()`` waits for outstanding ACKs before reporting them ``UNKNOWN``.
    Then it lets the server read what was sent (the CONFIRMs issued before ``close()``)
    for up to ``CLOSE_DRAIN_TIMEOUT`` (2 s) more, which a stream the server no longer
    reads (a client at its share of a proxy's buffer) waits out in full."""
    client_name: str = ""
    """Free text sent to the broker in Hello, for its logs."""
    token: str | None = field(default_factory=lambda: os.environ.get(TOKEN_ENV) or None)
    """Sent as ``authorization: Bearer <token>`` to servers started with ``--auth-file``
    (default ``$HOLDFAST_TOKEN``). A missing or wrong one fails the session with
    ``AuthenticationError``; one gRPC metadata cannot carry (not printable ASCII, or
    with a space) is an ``InvalidArgumentError`` here."""
    tls_ca: str | None = None
    """PEM file of the CA that signed the server's certificate: connect with TLS. With
    none (and no ``tls_cert``) the link is plaintext."""
    tls_cert: str | None = None
    """PEM client certificate, for servers that require one (``--tls-client-ca``)."""
    tls_key: str | None = None
    """PEM private key of ``tls_cert``."""
    telemetry: bool = True
    """With the ``[otel]`` extra installed: trace this session's posts, deliveries and
    settlements and export its ``stats()`` as OpenTelemetry metrics
    (``holdfast.sdk.tracing``). False keeps it out of OpenTelemetry altogether."""

    def __post_init__(self) -> None:
        _require(
            (self.tls_cert is None) == (self.tls_key is None), "tls_cert and tls_key go together"
        )
        _seconds("connect_timeout", self.connect_timeout)
        _seconds("keepalive_time", self.keepalive_time)
        _seconds("keepalive_timeout", self.keepalive_timeout)
        if self.token is not None and not sendable_token(self.token):
            given = "$" + TOKEN_ENV if self.token == os.environ.get(TOKEN_ENV) else "token"
            raise InvalidArgumentError(f"{given}: {TOKEN_RULE}")
        _require(self.high_watermark_bytes > 0, "high_watermark_bytes must be > 0")
        _require(
            0 < self.max_batch_bytes <= MAX_BATCH_BYTES,
            f"max_batch_bytes must be 1-{MAX_BATCH_BYTES} (brokers accept no bigger batches)",
        )
        _require(
            self.max_disconnected_buffer_bytes is None or self.max_disconnected_buffer_bytes > 0,
            "max_disconnected_buffer_bytes must be None or > 0",
        )
        _require(self.close_timeout >= 0, "close_timeout must be >= 0")

"""The proxy's options, as one immutable value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from holdfast.proto import pb
from holdfast.proto.limits import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_MAX_UNCONFIRMED_MESSAGES,
    MAX_BATCH_BYTES,
    MIB,
)
from holdfast.proxy.budget import DEFAULT_MAX_BUFFER_BYTES
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.failover import parse_addresses
from holdfast.sdk.options import QueueOptions, SessionOptions
from holdfast.server.security import ServerSecurity
from holdfast.server.serve import metrics_endpoint, split_host_port


def _named(name: str, check: Callable[[str], object], value: str) -> None:
    """``check(value)``, its error prefixed with the field's ``name`` (the CLI turns
    that into the flag: two fields take HOST:PORT, and the message must say which)."""
    try:
        check(value)
    except ValueError as error:  # InvalidArgumentError is one too
        raise InvalidArgumentError(f"{name}: {error}") from None


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Everything a proxy is started with. Values are checked on construction."""

    listen: str = "127.0.0.1:7701"
    """``HOST:PORT`` to serve applications on; port 0 picks a free port."""
    upstream: str = "127.0.0.1:7700"
    """``HOST:PORT[,HOST:PORT...]``: brokers to fail over across, in order."""
    upstream_options: SessionOptions = field(
        default_factory=lambda: SessionOptions(client_name="holdfast-proxy")
    )
    """Keepalive, reconnect back-off and buffering of the upstream session."""
    hello_wait: float = 5.0
    """Seconds between warnings while a client's Hello waits for the first broker to
    announce its limits. The Hello is answered only with limits a broker announced,
    never with invented ones (the client's own connect timeout bounds its wait)."""
    request_timeout: float = 60.0
    """Seconds a client's open/configure/close may wait for the broker."""
    max_frame_bytes: int = DEFAULT_BATCH_BYTES
    """Target size of one coalesced AckBatch or PushBatch frame to a client (at most
    ``MAX_BATCH_BYTES``)."""
    read_bound_bytes: int = 8 * MIB
    """A client stops being read while this many bytes of answers wait for it."""
    max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES
    """Bound on the bytes of client PUTs the proxy holds until their outcomes (payload,
    properties and bookkeeping), shared fairly by the clients connected: a client
    holding its share is no longer read, so its own ``post()`` waits, then raises
    ``BandwidthLimitError`` (``holdfast.proxy.budget``)."""
    shutdown_grace: float = 5.0
    """Seconds clients get on SIGTERM to receive what is queued for them."""
    metrics_port: int | None = None
    """Port of the Prometheus ``/metrics`` endpoint on 127.0.0.1; ``None`` (the
    default) serves none, 0 picks a free port (logged ``metrics on HOST:PORT``)."""
    metrics_listen: str | None = None
    """``HOST:PORT`` of the metrics, ``/healthz`` and ``/readyz`` endpoint (any host);
    wins over ``metrics_port``."""
    security: ServerSecurity = field(default_factory=ServerSecurity)
    """TLS, tokens and limits of the proxy's own listener (its clients)."""

    def __post_init__(self) -> None:
        _named("listen", split_host_port, self.listen)
        _named("upstream", parse_addresses, self.upstream)
        for name in ("hello_wait", "request_timeout", "shutdown_grace"):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(f"{name} must be >= 0")
        if self.read_bound_bytes <= 0:
            raise InvalidArgumentError("read_bound_bytes must be > 0")
        if self.max_buffer_bytes <= 0:
            raise InvalidArgumentError("max_buffer_bytes must be > 0")
        if not 0 < self.max_frame_bytes <= MAX_BATCH_BYTES:
            raise InvalidArgumentError(f"max_frame_bytes must be 1-{MAX_BATCH_BYTES}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise InvalidArgumentError("metrics_port must be 0-65535")
        if self.metrics_listen is not None:
            _named("metrics_listen", split_host_port, self.metrics_listen)

    @property
    def max_unconfirmed_bytes(self) -> int:
        """The most unconfirmed payload bytes the proxy asks the broker to push to one
        client's queue handle, whatever the client asked for: an eighth of
        ``max_buffer_bytes`` (32 MiB, the SDK's default, at the default bound), at
        least 1 MiB. PUSHes wait in the proxy until their client reads them, so a
        client's own limits would let one that stops reading grow the proxy by its
        queue's depth; the broker pushes more as the client confirms."""
        return max(MIB, self.max_buffer_bytes // 8)

    @property
    def max_unconfirmed_messages(self) -> int:
        """The most unconfirmed messages asked for one client's queue handle, likewise:
        one per KiB of ``max_unconfirmed_bytes``, at least the SDK's default (1000)."""
        return max(DEFAULT_MAX_UNCONFIRMED_MESSAGES, self.max_unconfirmed_bytes // 1024)

    def flow_limits(self, asked: pb.QueueOptions | None) -> QueueOptions:
        """The flow limits to ask upstream for a client that asked for ``asked``
        (None: the defaults), cut to ``max_unconfirmed_messages`` and ``_bytes``."""
        wanted = (
            QueueOptions()
            if asked is None
            else QueueOptions(asked.max_unconfirmed_messages, asked.max_unconfirmed_bytes)
        )
        return QueueOptions(
            min(wanted.max_unconfirmed_messages, self.max_unconfirmed_messages),
            min(wanted.max_unconfirmed_bytes, self.max_unconfirmed_bytes),
        )

    @property
    def metrics_address(self) -> tuple[str, int, str] | None:
        """(host, port, flag) of the metrics endpoint, if one is asked for."""
        return metrics_endpoint(self.metrics_listen, self.metrics_port)

    @property
    def upstream_addresses(self) -> list[str]:
        """The upstream brokers, in failover order."""
        return parse_addresses(self.upstream)

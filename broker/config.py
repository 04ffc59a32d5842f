"""The broker's options, as one immutable value."""

from __future__ import annotations

from dataclasses import dataclass, field

from holdfast.broker.dedup import DEFAULT_GRACE, MAX_GRACE, default_max_guids
from holdfast.broker.redis.bounds import (
    MAX_LEASE,
    MAX_MIN_REPLICAS,
    MAX_RETRY,
    MIN_LEASE,
    seconds_range,
)
from holdfast.broker.redis.tls import RedisTls
from holdfast.broker.sqlite_store import DEFAULT_SYNC, SYNC_MODES
from holdfast.broker.staging import StagingLimits
from holdfast.broker.stores import parse_store_spec
from holdfast.proto.limits import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_PROPERTIES,
    DEFAULT_MAX_PROPERTIES_BYTES,
    MAX_BATCH_BYTES,
    MAX_DEDUP_WINDOW,
    MIB,
    Limits,
)
from holdfast.server.security import ServerSecurity
from holdfast.server.serve import metrics_endpoint, split_host_port


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything a broker is started with. Values are checked on construction."""

    listen: str = "127.0.0.1:7700"
    """``HOST:PORT`` to serve on; port 0 picks a free port (logged once bound)."""
    store: str = "memory"
    """Where queues are kept: ``memory`` (nothing survives a restart) or
    ``sqlite:PATH`` (messages, delivery counts and the GUID history survive)."""
    sync: str = DEFAULT_SYNC
    """How a durable store syncs its commits: ``full`` (fsync on every commit: an
    ACKed message survives a power loss) or ``normal`` (survives a crash or kill -9 of
    the broker; an OS crash or power loss may lose the last commits)."""
    dedup_window: float = DEFAULT_DEDUP_WINDOW
    """Seconds a queue remembers an accepted GUID and ACKs its replays without
    enqueuing them again. Announced to clients in HelloReply; a PUT of an unknown GUID
    whose ``age_ms`` is past it is refused with TOO_OLD."""
    dedup_grace: float = DEFAULT_GRACE
    """Seconds the history keeps a GUID past the window: covers the time a PUT spends
    in flight after its last hop set its ``age_ms`` (see ``holdfast.broker.dedup``)."""
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    """Largest payload a PUT may carry; a bigger one is ACKed PAYLOAD_TOO_LARGE."""
    max_properties: int = DEFAULT_MAX_PROPERTIES
    """Most properties one message may carry."""
    max_properties_bytes: int = DEFAULT_MAX_PROPERTIES_BYTES
    """Most bytes (UTF-8 keys plus values) the properties of one message may take."""
    dedup_max_guids: int = field(default_factory=default_max_guids)
    """Memory bound: most GUIDs all histories of the broker hold together. Past it, new
    PUTs are refused with HISTORY_FULL until entries expire; nothing is forgotten
    early. Default: ``$HOLDFAST_HISTORY_MAX_GUIDS`` or ``dedup.DEFAULT_MAX_GUIDS``."""
    session_read_bound_bytes: int = 8 * MIB
    """A session stops reading client frames while more than this many bytes of its
    ACKs and responses wait to be sent, so a client that does not read cannot make
    the broker buffer without bound."""
    max_frame_bytes: int = DEFAULT_BATCH_BYTES
    """Target size of one coalesced AckBatch or PushBatch frame (at most
    ``MAX_BATCH_BYTES``; a single larger message travels alone)."""
    shutdown_grace: float = 5.0
    """Seconds sessions get on SIGTERM to receive what is queued for them."""
    metrics_port: int | None = None
    """Port of the Prometheus ``/metrics`` endpoint on 127.0.0.1; ``None`` (the
    default) serves none, 0 picks a free port (logged ``metrics on HOST:PORT``)."""
    metrics_listen: str | None = None
    """``HOST:PORT`` of the metrics, ``/healthz`` and ``/readyz`` endpoint on any host
    (``--metrics-listen``); wins over ``metrics_port``."""
    redis_min_replicas: int = 0
    """Redis store: each PUT waits for ``WAIT N`` replicas; fewer in time: ACK UNKNOWN."""
    redis_retry: float = 30.0
    """Redis store: seconds an outage is retried before PUTs fail with STORE_ERROR
    (a PUT sent to Redis and not answered is retried until Redis answers: ``puts``)."""
    redis_lease: float = 3.0
    """Redis store: seconds a node may deliver after its last lease renewal; its peers
    reclaim its deliveries no sooner than a third of that later (``lease``)."""
    redis_tls: RedisTls = field(default_factory=lambda: RedisTls())
    """Redis store over TLS (``rediss://``): the CA and client certificate."""
    security: ServerSecurity = field(default_factory=ServerSecurity)
    """TLS, tokens and per-session limits (``holdfast.server.security``)."""
    staging: StagingLimits = field(default_factory=StagingLimits)
    """Transactional writes: rows and bytes staged at most per (queue, application) and
    per token, and how long staged rows wait for their commit (``staging``)."""

    def __post_init__(self) -> None:
        split_host_port(self.listen)
        parse_store_spec(self.store)
        _check(self.sync in SYNC_MODES, f"sync must be one of {', '.join(SYNC_MODES)}")
        # Building the announced limits checks them (ValueError if they are unusable).
        self.limits  # noqa: B018
        _check(
            self.dedup_window <= MAX_DEDUP_WINDOW,
            f"dedup_window must be at most {MAX_DEDUP_WINDOW:.0f} seconds, not {self.dedup_window}",
        )
        _check(
            0 <= self.dedup_grace <= MAX_GRACE,
            f"dedup_grace must be >= 0 and at most {MAX_GRACE:.0f} seconds",
        )
        _check(self.dedup_max_guids > 0, "dedup_max_guids must be > 0")
        _check(self.session_read_bound_bytes > 0, "session_read_bound_bytes must be > 0")
        _check(
            0 < self.max_frame_bytes <= MAX_BATCH_BYTES,
            f"max_frame_bytes must be 1-{MAX_BATCH_BYTES}",
        )
        _check(self.shutdown_grace >= 0, "shutdown_grace must be >= 0")
        _check(
            self.metrics_port is None or 0 <= self.metrics_port <= 65535,
            "metrics_port must be 0-65535",
        )
        if self.metrics_listen is not None:
            split_host_port(self.metrics_listen)
        self._check_redis()

    def _check_redis(self) -> None:
        """The ``--redis-*`` values: in their ranges (``redis.bounds``), and given only
        with a Redis store (a flag that does nothing is a mistake worth a line)."""
        _check(
            0 <= self.redis_min_replicas <= MAX_MIN_REPLICAS,
            f"redis_min_replicas must be 0-{MAX_MIN_REPLICAS}",
        )
        _check(
            0 < self.redis_retry <= MAX_RETRY,
            f"redis_retry must be {seconds_range(0, MAX_RETRY, low_included=False)}",
        )
        _check(
            MIN_LEASE <= self.redis_lease <= MAX_LEASE,
            f"redis_lease must be {seconds_range(MIN_LEASE, MAX_LEASE)}",
        )
        if parse_store_spec(self.store).kind != "redis":
            defaults = BrokerConfig.__dataclass_fields__
            given = [
                flag
                for name, flag in REDIS_FLAGS.items()
                if getattr(self, name) != defaults[name].default
            ]
            tls = self.redis_tls
            given += [
                flag
                for flag, path in (
                    ("--redis-ca", tls.ca),
                    ("--redis-cert", tls.cert),
                    ("--redis-key", tls.key),
                )
                if path is not None
            ]
            _check(
                not given,
                f"{', '.join(given)}: only for a Redis store (--store redis://, rediss://, "
                f"redis+cluster:// or redis+sentinel://), not {self.store.partition(':')[0]}",
            )
        _check(
            not self.redis_tls.configured or self.store.startswith("rediss://"),
            "--redis-ca, --redis-cert and --redis-key need a rediss:// store",
        )

    @property
    def metrics_address(self) -> tuple[str, int, str] | None:
        """(host, port, flag) of the metrics endpoint, if one is asked for."""
        return metrics_endpoint(self.metrics_listen, self.metrics_port)

    @property
    def limits(self) -> Limits:
        """What this broker announces in HelloReply and enforces on every PUT; its
        ``max_frame_bytes`` is the broker's gRPC send and receive limit."""
        return Limits(
            dedup_window=self.dedup_window,
            max_payload_bytes=self.max_payload_bytes,
            max_properties=self.max_properties,
            max_properties_bytes=self.max_properties_bytes,
        )


REDIS_FLAGS = {
    "redis_min_replicas": "--redis-min-replicas",
    "redis_retry": "--redis-retry",
    "redis_lease": "--redis-lease",
}
"""Fields of the Redis store's settings and the flags that set them."""

CONFIG_FLAGS = {"sync": "--sync", **REDIS_FLAGS}
"""Fields checked here whose errors should name their flags (``cli_support.name_flags``)."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)

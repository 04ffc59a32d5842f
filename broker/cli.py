"""``holdfast-broker``: run a broker until SIGTERM or SIGINT.

    holdfast-broker --listen 127.0.0.1:7700 --store memory --dedup-window 300
    holdfast-broker --store sqlite:/var/lib/holdfast/broker.db --sync full
    holdfast-broker --metrics-port 9770   # Prometheus metrics on 127.0.0.1:9770

Once it serves, the broker logs one line ``listening on HOST:PORT`` (with the
real port when ``--listen`` asks for port 0) to stderr. SIGTERM or SIGINT stop it
gracefully and it exits 0. A store that cannot be opened or read (not a database,
another schema version, a directory, no permission, in use by another broker) is
reported in one line and the broker exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from holdfast.broker.config import CONFIG_FLAGS, BrokerConfig
from holdfast.broker.dedup import DEFAULT_MAX_GUIDS, MAX_GRACE
from holdfast.broker.redis.bounds import (
    MAX_LEASE,
    MAX_MIN_REPLICAS,
    MAX_RETRY,
    MIN_LEASE,
)
from holdfast.broker.redis.tls import RedisTls
from holdfast.broker.server import Broker
from holdfast.broker.sqlite_store import SYNC_MODES
from holdfast.broker.staging import MAX_STAGE_RETENTION, StagingLimits
from holdfast.broker.store import Store, StoreError
from holdfast.broker.stores import open_store, parse_store_spec
from holdfast.proto.limits import FRAME_CEILING, MAX_DEDUP_WINDOW, Limits
from holdfast.server.cli_support import (
    OneLineParser,
    add_common_flags,
    apply_environment,
    configure_logging,
    name_flags,
    seconds,
    whole_number,
)
from holdfast.server.grpc_logs import route_grpc_logs
from holdfast.server.security import (
    LIMIT_FLAGS,
    SecurityError,
    add_security_flags,
    security_from_args,
)
from holdfast.server.serve import serve_until_signalled, split_host_port, tune_collector

log = logging.getLogger("holdfast.broker")

MAX_PAYLOAD_FLAG = FRAME_CEILING - Limits(max_payload_bytes=1).max_frame_bytes + 1
"""The largest ``--max-payload-bytes``: a maximal PUT (with the default property
limits) in a full batch still fits the frames every client accepts (``FRAME_CEILING``)."""

FLAGS = {
    **LIMIT_FLAGS,
    **CONFIG_FLAGS,
    "dedup_window": "--dedup-window",
    "dedup_grace": "--dedup-grace",
    "max_payload_bytes": "--max-payload-bytes",
}
"""Fields of ``BrokerConfig`` and the flags that set them, for errors that name flags."""

T = TypeVar("T")


def _argument(convert: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type`` that reports ``convert``'s ValueError as a usage error."""

    def check(text: str) -> T:
        try:
            return convert(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return check


def _address(text: str) -> str:
    split_host_port(text)
    return text


def _store(text: str) -> str:
    parse_store_spec(text)
    return text


def _sync_mode(text: str) -> str:
    # A type rather than ``choices``: argparse checks choices only on the command line,
    # and HOLDFAST_SYNC=fast went through to a config error naming neither.
    mode = text.lower()
    if mode not in SYNC_MODES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(SYNC_MODES)}, got {text!r}")
    return mode


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be > 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"must be 0-65535, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``holdfast-broker``."""
    # Not the environment's HOLDFAST_HISTORY_MAX_GUIDS here: a bad one must fail as the
    # flag's value, named (``apply_environment``), not as a traceback building the parser.
    defaults = BrokerConfig(dedup_max_guids=DEFAULT_MAX_GUIDS)
    parser = OneLineParser(
        prog="holdfast-broker",
        description="The Holdfast reference broker: queues, delivery and GUID dedup over gRPC.",
    )
    parser.add_argument(
        "--listen",
        default=defaults.listen,
        type=_argument(_address),
        help="HOST:PORT to serve on; port 0 picks a free one (default: %(default)s)",
    )
    parser.add_argument(
        "--store",
        default=defaults.store,
        type=_argument(_store),
        help="where queues are kept: memory, sqlite:PATH for a durable file, or "
        "redis://HOST:PORT[/DB] (rediss://, redis+cluster://H:P[,H:P...], "
        "redis+sentinel://H:P[,H:P...]/SERVICE[/DB]) shared by several broker nodes "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--sync",
        default=defaults.sync,
        type=_sync_mode,
        metavar="{" + ",".join(SYNC_MODES) + "}",
        help="sqlite store: full fsyncs every commit, so an ACKed message survives a power "
        "loss; normal survives a crash or kill -9 of the broker, but an OS crash or power "
        "loss may lose the last commits (default: %(default)s)",
    )
    parser.add_argument(
        "--dedup-window",
        default=defaults.dedup_window,
        type=seconds(MAX_DEDUP_WINDOW),
        metavar="SECONDS",
        help="how long a queue remembers accepted GUIDs, at most 30 days (default: %(default)s)",
    )
    parser.add_argument(
        "--dedup-grace",
        default=defaults.dedup_grace,
        type=seconds(MAX_GRACE, zero=True),
        metavar="SECONDS",
        help="how long past the window a GUID is still remembered, to cover the time a "
        "PUT spends in flight after its last hop set its age, at most a day "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--history-max-guids",
        default=defaults.dedup_max_guids,
        type=_argument(_positive_int),
        metavar="N",
        help="most GUIDs all dedup histories hold; past it new PUTs are refused with "
        "HISTORY_FULL until entries expire (default: $HOLDFAST_HISTORY_MAX_GUIDS or "
        "%(default)s, about 1 GB: 330 s at 100k msg/s)",
    )
    parser.add_argument(
        "--max-payload-bytes",
        default=defaults.max_payload_bytes,
        type=whole_number(1, maximum=MAX_PAYLOAD_FLAG),
        metavar="BYTES",
        help="largest payload a PUT may carry (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        default=defaults.metrics_port,
        type=_argument(_port),
        metavar="PORT",
        help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics; 0 picks a free "
        "port (logged as 'metrics on HOST:PORT') (default: off)",
    )
    parser.add_argument(
        "--metrics-listen",
        type=_argument(_address),
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz on HOST:PORT (any host; wins over "
        "--metrics-port) (default: off)",
    )
    parser.add_argument(
        "--redis-min-replicas",
        type=whole_number(0, maximum=MAX_MIN_REPLICAS),
        default=defaults.redis_min_replicas,
        metavar="N",
        help="Redis store: an ACK waits for WAIT N replicas; at most "
        f"{MAX_MIN_REPLICAS}, Redis's default maxclients (default: %(default)s)",
    )
    parser.add_argument(
        "--redis-retry",
        type=seconds(MAX_RETRY),
        default=defaults.redis_retry,
        metavar="SECONDS",
        help="Redis store: how long an outage is retried before PUTs fail with STORE_ERROR "
        "(a PUT sent to Redis unanswered is retried until Redis answers); at most "
        f"{MAX_RETRY:g} (default: %(default)s)",
    )
    parser.add_argument(
        "--redis-lease",
        type=seconds(MAX_LEASE, minimum=MIN_LEASE),
        default=defaults.redis_lease,
        metavar="SECONDS",
        help="Redis store: a node stops delivering this long after its last lease renewal; "
        "its peers reclaim its deliveries a third of it later; keep it at least the "
        "clients' keepalive + keepalive timeout (3 s), the time a frozen node's consumers "
        f"take to notice; {MIN_LEASE:g}-{MAX_LEASE:g} (default: %(default)s)",
    )
    parser.add_argument(
        "--redis-ca", metavar="PATH", help="Redis store over TLS (rediss://): PEM CA of Redis"
    )
    parser.add_argument(
        "--redis-cert", metavar="PATH", help="Redis store over TLS: PEM client certificate"
    )
    parser.add_argument(
        "--redis-key", metavar="PATH", help="Redis store over TLS: PEM key of --redis-cert"
    )
    parser.add_argument(
        "--stage-retention",
        type=seconds(MAX_STAGE_RETENTION),
        default=defaults.staging.retention,
        metavar="SECONDS",
        help="transactional writes: how long staged rows wait for their commit before they "
        "are discarded (logged and counted) (default: %(default)s, 7 days)",
    )
    parser.add_argument(
        "--stage-max-rows-per-token",
        type=_argument(_positive_int),
        default=defaults.staging.max_rows_per_token,
        metavar="N",
        help="transactional writes: rows one token may have staged at once; a stage call "
        "past it is refused with LIMIT_EXCEEDED (default: %(default)s)",
    )
    parser.add_argument(
        "--stage-max-bytes-per-token",
        type=_argument(_positive_int),
        default=defaults.staging.max_bytes_per_token,
        metavar="BYTES",
        help="transactional writes: payload bytes one token may have staged at once "
        "(default: %(default)s)",
    )
    add_security_flags(parser)
    add_common_flags(parser, "holdfast-broker")
    apply_environment(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    """The ``BrokerConfig`` parsed command-line arguments describe."""
    return BrokerConfig(
        listen=args.listen,
        store=args.store,
        sync=args.sync,
        dedup_window=args.dedup_window,
        dedup_grace=args.dedup_grace,
        dedup_max_guids=args.history_max_guids,
        max_payload_bytes=args.max_payload_bytes,
        metrics_port=args.metrics_port,
        metrics_listen=args.metrics_listen,
        redis_min_replicas=args.redis_min_replicas,
        redis_retry=args.redis_retry,
        redis_lease=args.redis_lease,
        redis_tls=RedisTls(args.redis_ca, args.redis_cert, args.redis_key),
        security=security_from_args(args),
        staging=StagingLimits(
            retention=args.stage_retention,
            max_rows_per_token=args.stage_max_rows_per_token,
            max_bytes_per_token=args.stage_max_bytes_per_token,
        ),
    )


async def serve(config: BrokerConfig, store: Store | None = None) -> int:
    """Run a broker (on ``store``, or the one ``config`` names) until SIGTERM or SIGINT,
    then stop it gracefully; the exit code."""
    broker = Broker(config, store)
    try:
        await broker.start()
    except StoreError as error:
        # The file opened but its contents cannot be read back.
        log.error("%s", error)
        broker.store.close()
        return 2
    except OSError as error:
        # A port in use or an address it cannot bind: a start-up mistake, like a bad flag.
        log.error("%s", error)
        broker.store.close()
        return 2
    await serve_until_signalled(broker.stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``holdfast-broker`` and ``python -m holdfast.broker``."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    route_grpc_logs()
    try:
        config = config_from_args(args)
        # Read the TLS and token files now: one error line before anything runs.
        config.security.credentials()
        config.security.guard()
    except SecurityError as error:
        log.error("%s", error)
        return 2
    except ValueError as error:
        message = name_flags(str(error), FLAGS)
        log.error("invalid configuration: %s", message)
        return 2
    try:
        # Opened here rather than by Broker, so the store gets the broker's dedup window
        # and sync mode, and a store that cannot be used stops us before anything runs.
        store = open_store(
            config.store,
            dedup_window=config.dedup_window,
            dedup_grace=config.dedup_grace,
            sync=config.sync,
        )
    except StoreError as error:
        log.error("%s", error)
        return 2
    tune_collector()
    return asyncio.run(serve(config, store))


if __name__ == "__main__":
    sys.exit(main())

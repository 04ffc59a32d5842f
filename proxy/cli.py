"""``holdfast-proxy``: run the local sidecar until SIGTERM or SIGINT.

    holdfast-proxy --listen 127.0.0.1:7701 --upstream 127.0.0.1:7700,10.0.0.2:7700

Once it serves, the proxy logs one line ``listening on HOST:PORT`` to stderr. It
connects upstream in the background and fails over across the ``--upstream``
list in order; applications may connect before any broker is reachable.
SIGTERM or SIGINT stop it gracefully and it exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from holdfast.proto.credentials import TOKEN_RULE, sendable_token
from holdfast.proxy.config import ProxyConfig
from holdfast.proxy.server import Proxy
from holdfast.sdk.credentials import channel_credentials
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from holdfast.server.cli_support import (
    OneLineParser,
    add_common_flags,
    apply_environment,
    configure_logging,
    name_flags,
    whole_number,
)
from holdfast.server.grpc_logs import route_grpc_logs
from holdfast.server.heap import fix_mmap_threshold
from holdfast.server.security import (
    LIMIT_FLAGS,
    SecurityError,
    add_security_flags,
    security_from_args,
)
from holdfast.server.serve import serve_until_signalled, tune_collector

log = logging.getLogger("holdfast.proxy")

UPSTREAM_TOKEN_ENV = "HOLDFAST_UPSTREAM_TOKEN"
"""Where the proxy's own token is read from without ``--upstream-token-file``."""

MAX_BUFFER_FLAG = 1 << 40
"""The largest ``--max-buffer-bytes`` taken (1 TiB): more is a typo, not a bound."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``holdfast-proxy``."""
    defaults = ProxyConfig()
    session = defaults.upstream_options
    parser = OneLineParser(
        prog="holdfast-proxy",
        description="The Holdfast sidecar: the broker's contract locally, with HA upstream.",
    )
    parser.add_argument("--listen", default=defaults.listen, help="(default: %(default)s)")
    parser.add_argument(
        "--upstream",
        default=defaults.upstream,
        help="HOST:PORT[,HOST:PORT...] of brokers, in failover order (default: %(default)s)",
    )
    parser.add_argument(
        "--keepalive",
        type=float,
        default=session.keepalive_time,
        metavar="SECONDS",
        help="upstream keepalive ping interval (default: %(default)s)",
    )
    parser.add_argument(
        "--keepalive-timeout",
        type=float,
        default=session.keepalive_timeout,
        metavar="SECONDS",
        help="upstream link declared dead after this long without a ping answer "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--reconnect-max",
        type=float,
        default=session.reconnect.maximum,
        metavar="SECONDS",
        help="cap of the upstream reconnect back-off (default: %(default)s)",
    )
    parser.add_argument(
        "--max-buffer-bytes",
        type=whole_number(1, maximum=MAX_BUFFER_FLAG),
        default=defaults.max_buffer_bytes,
        metavar="BYTES",
        help="bound on the bytes of client PUTs held until the broker ACKs them, shared "
        "fairly by the clients connected: a client holding its share is not read until "
        "some are ACKed, so its post() waits, then raises BandwidthLimitError "
        "(default: %(default)s, 256 MiB; at most 1 TiB)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=defaults.metrics_port,
        metavar="PORT",
        help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics; 0 picks a free "
        "port (logged as 'metrics on HOST:PORT') (default: off)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz on HOST:PORT (any host; wins over "
        "--metrics-port) (default: off)",
    )
    parser.add_argument(
        "--upstream-ca", metavar="PATH", help="PEM CA of the brokers' certificates: TLS upstream"
    )
    parser.add_argument(
        "--upstream-cert", metavar="PATH", help="PEM client certificate for brokers that need one"
    )
    parser.add_argument("--upstream-key", metavar="PATH", help="PEM key of --upstream-cert")
    parser.add_argument(
        "--upstream-token-file",
        metavar="PATH",
        help="file holding the proxy's own token for the brokers "
        "(default: $HOLDFAST_UPSTREAM_TOKEN)",
    )
    add_security_flags(parser)
    add_common_flags(parser, "holdfast-proxy")
    apply_environment(parser)
    return parser


FLAGS = {
    "keepalive_timeout": "--keepalive-timeout",
    "keepalive_time": "--keepalive",
    "ReconnectOptions.maximum": "--reconnect-max",
    "maximum": "--reconnect-max",
    "max_buffer_bytes": "--max-buffer-bytes",
    "metrics_listen": "--metrics-listen",
    "listen": "--listen",
    "upstream": "--upstream",
    "tls_ca": "--upstream-ca",
    "tls_cert": "--upstream-cert",
    "tls_key": "--upstream-key",
    **LIMIT_FLAGS,
}
"""Fields of the upstream SessionOptions and the proxy flags that set them."""


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    """The ``ProxyConfig`` parsed command-line arguments describe."""
    if not 0 < args.reconnect_max < math.inf:
        raise InvalidArgumentError(f"--reconnect-max must be > 0 seconds, not {args.reconnect_max}")
    # A cap below the default first delay starts there too.
    first = min(ReconnectOptions().initial, args.reconnect_max)
    reconnect = ReconnectOptions(initial=first, maximum=args.reconnect_max)
    return ProxyConfig(
        listen=args.listen,
        upstream=args.upstream,
        upstream_options=SessionOptions(
            keepalive_time=args.keepalive,
            keepalive_timeout=args.keepalive_timeout,
            reconnect=reconnect,
            client_name="holdfast-proxy",
            token=_upstream_token(args.upstream_token_file),
            tls_ca=args.upstream_ca,
            tls_cert=args.upstream_cert,
            tls_key=args.upstream_key,
        ),
        max_buffer_bytes=args.max_buffer_bytes,
        metrics_port=args.metrics_port,
        metrics_listen=args.metrics_listen,
        security=security_from_args(args),
    )


def _upstream_token(path: str | None) -> str | None:
    """The proxy's own token: the first line of ``--upstream-token-file``, else
    ``$HOLDFAST_UPSTREAM_TOKEN`` (never ``$HOLDFAST_TOKEN``: that is a client's)."""
    if path is None:
        token = os.environ.get(UPSTREAM_TOKEN_ENV) or None
        if token is not None and not sendable_token(token):
            raise SecurityError(f"${UPSTREAM_TOKEN_ENV}: {TOKEN_RULE}")
        return token
    source = f"--upstream-token-file {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise SecurityError(f"{source}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise SecurityError(f"{source}: not UTF-8 text ({TOKEN_RULE})") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise SecurityError(f"{source}: the file is empty")
    if not sendable_token(token):
        raise SecurityError(f"{source}: {TOKEN_RULE}")
    return token


async def serve(config: ProxyConfig) -> int:
    """Run a proxy until SIGTERM or SIGINT, then stop it gracefully; the exit code."""
    proxy = Proxy(config)
    try:
        await proxy.start()
    except OSError as error:
        # Nothing started (see Proxy.start): one line, no shutdown noise after it. A port
        # in use is a start-up mistake, like a bad flag: exit code 2.
        log.error("%s", error)
        return 2
    await serve_until_signalled(proxy.stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``holdfast-proxy`` and ``python -m holdfast.proxy``."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    route_grpc_logs()
    try:
        config = config_from_args(args)
        # Read the TLS and token files now: one error line before anything runs.
        config.security.credentials()
        config.security.guard()
        channel_credentials(
            config.upstream_options.tls_ca,
            config.upstream_options.tls_cert,
            config.upstream_options.tls_key,
        )
    except SecurityError as error:
        log.error("%s", error)
        return 2
    except (InvalidArgumentError, ValueError) as error:
        log.error("invalid configuration: %s", name_flags(str(error), FLAGS))
        return 2
    tune_collector()
    fix_mmap_threshold()
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())

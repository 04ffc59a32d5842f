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
import sys
from collections.abc import Sequence

from holdfast.proto.cli_support import (
    add_common_flags,
    apply_environment,
    configure_logging,
    name_flags,
)
from holdfast.proto.serve import serve_until_signalled
from holdfast.proxy.config import ProxyConfig
from holdfast.proxy.server import Proxy
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.options import ReconnectOptions, SessionOptions

log = logging.getLogger("holdfast.proxy")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``holdfast-proxy``."""
    defaults = ProxyConfig()
    session = defaults.upstream_options
    parser = argparse.ArgumentParser(
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
        "--metrics-port",
        type=int,
        default=defaults.metrics_port,
        metavar="PORT",
        help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics; 0 picks a free "
        "port (logged as 'metrics on HOST:PORT') (default: off)",
    )
    add_common_flags(parser, "holdfast-proxy")
    apply_environment(parser)
    return parser


FLAGS = {
    "keepalive_timeout": "--keepalive-timeout",
    "keepalive_time": "--keepalive",
    "ReconnectOptions.maximum": "--reconnect-max",
    "maximum": "--reconnect-max",
    "initial": "--reconnect-max (the first delay)",
}
"""Fields of the upstream SessionOptions and the proxy flags that set them."""


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    """The ``ProxyConfig`` parsed command-line arguments describe."""
    reconnect = ReconnectOptions(maximum=args.reconnect_max)
    return ProxyConfig(
        listen=args.listen,
        upstream=args.upstream,
        upstream_options=SessionOptions(
            keepalive_time=args.keepalive,
            keepalive_timeout=args.keepalive_timeout,
            reconnect=reconnect,
            client_name="holdfast-proxy",
        ),
        metrics_port=args.metrics_port,
    )


async def serve(config: ProxyConfig) -> int:
    """Run a proxy until SIGTERM or SIGINT, then stop it gracefully; the exit code."""
    proxy = Proxy(config)
    try:
        await proxy.start()
    except OSError as error:
        log.error("%s", error)
        await proxy.stop(0)
        return 1
    await serve_until_signalled(proxy.stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``holdfast-proxy`` and ``python -m holdfast.proxy``."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        config = config_from_args(args)
    except (InvalidArgumentError, ValueError) as error:
        log.error("invalid configuration: %s", name_flags(str(error), FLAGS))
        return 2
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())

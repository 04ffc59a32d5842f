"""``holdfast-pool``: run the manager of one keyed worker pool.

::

    holdfast-pool --address HOST:PORT --pool NAME --worker-command CMD
                  [--driver subprocess|noop] [--unbind-delay S] [--stop-delay S]
                  [--max-deliveries N] [--processing-timeout S]
                  [--admin-address HOST:PORT]

``NAME`` is the pool's URI, ``hf://<domain>/<pool>`` (``<domain>/<pool>`` works too).
``CMD`` is split like a shell would split it (``shlex``) but never run by a shell;
each worker gets ``WORKER_ID``, ``WORKER_KEY``, ``WORKER_POOL``,
``WORKER_REQUESTS_QUEUE``, ``HOLDFAST_ADDRESS`` and ``WORKER_LIFELINE_FD`` in its
environment, and runs in a process group of its own: a wrapper script must keep its
worker in that group (``holdfast.pool.drivers``). The admin
calls (policies, queue stats) go to ``--admin-address``, by default ``--address``:
point either at a broker. Every flag has a ``HOLDFAST_`` environment variable. Stops
on SIGTERM/SIGINT, stopping the workers it started.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence

from holdfast.pool.drivers import DRIVERS, NoopDriver, SubprocessDriver, WorkerGroupDriver
from holdfast.pool.manager import PoolManager, PoolSettings, PoolStartError
from holdfast.proto.credentials import TOKEN_RULE, sendable_token
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.poolnames import PoolNames
from holdfast.server.cli_support import (
    OneLineParser,
    add_common_flags,
    apply_environment,
    configure_logging,
    name_flags,
)
from holdfast.server.grpc_logs import route_grpc_logs
from holdfast.server.serve import split_host_port

log = logging.getLogger("holdfast.pool")


def parser() -> argparse.ArgumentParser:
    """The ``holdfast-pool`` argument parser."""
    args = OneLineParser(
        prog="holdfast-pool", description="Run the manager of a keyed worker pool."
    )
    args.add_argument("--address", required=True, help="the broker or proxy, HOST:PORT")
    args.add_argument("--pool", required=True, help="the pool, hf://<domain>/<pool>")
    args.add_argument("--worker-command", help="the worker program and its arguments")
    args.add_argument(
        "--driver", choices=DRIVERS, default="subprocess", help="(default: %(default)s)"
    )
    args.add_argument("--unbind-delay", type=float, default=30.0, help="seconds (default: 30)")
    args.add_argument("--stop-delay", type=float, default=60.0, help="seconds (default: 60)")
    args.add_argument("--max-deliveries", type=int, default=3, help="(default: 3)")
    args.add_argument(
        "--processing-timeout",
        type=float,
        metavar="S",
        help="seconds a worker may spend on one request, or stay silent (frozen), before "
        "it is replaced (default: none)",
    )
    args.add_argument("--admin-address", help="the broker's HOST:PORT (default: --address)")
    args.add_argument("--token", help="an admin token for the pool's policies ($HOLDFAST_TOKEN)")
    args.add_argument("--tls-ca", metavar="PATH", help="PEM CA of the broker: TLS (workers too)")
    add_common_flags(args, "holdfast-pool")
    apply_environment(args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run a pool manager until SIGTERM/SIGINT; returns the exit code."""
    args = parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    route_grpc_logs(server=False)  # gRPC's own lines (a TLS handshake) in this log
    # Only a bare <domain>/<pool> gets the scheme: anything with one (hf:/x, http://x)
    # is checked, and quoted in its error, as the user typed it.
    pool = args.pool if ":" in args.pool else f"hf://{args.pool}"
    try:
        for flag, value in (("--address", args.address), ("--admin-address", args.admin_address)):
            if value is not None:
                try:
                    split_host_port(value)
                except ValueError as error:
                    raise ValueError(f"{flag}: {error}") from None
        if args.token is not None and not sendable_token(args.token):
            # Else gRPC's C-core logs each refused call and the start fails "INTERNAL:
            # Invalid metadata" blaming --address.
            given = (
                "$HOLDFAST_TOKEN" if args.token == os.environ.get("HOLDFAST_TOKEN") else "--token"
            )
            raise ValueError(f"{given}: {TOKEN_RULE}")
        try:
            PoolNames.of(pool)
        except HoldfastError as error:
            raise ValueError(f"--pool: {error}") from None
        settings = PoolSettings(
            address=args.address,
            admin_address=args.admin_address or args.address,
            pool=pool,
            unbind_delay=args.unbind_delay,
            stop_delay=args.stop_delay,
            max_deliveries=args.max_deliveries,
            token=args.token,
            tls_ca=args.tls_ca,
            processing_timeout=args.processing_timeout,
        )
        driver = _driver(args.driver, args.worker_command)
        manager = PoolManager(settings, driver)
    except (ValueError, HoldfastError) as error:
        message = name_flags(str(error).splitlines()[0], {"tls_ca": "--tls-ca"})
        print(f"holdfast-pool: {message}", file=sys.stderr)
        return 2
    except OSError as error:  # a file it reads: the CA of --tls-ca
        print(f"holdfast-pool: --tls-ca {args.tls_ca}: {error.strerror or error}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        manager.start()
    except PoolStartError as error:
        # start() closed what it had opened: nothing ran, so nothing is stopped.
        print(f"holdfast-pool: cannot start: {error}", file=sys.stderr)
        return 2
    log.info("managing pool %s (driver %s)", settings.pool, args.driver)
    stop.wait()
    manager.stop()
    return 0


def _driver(name: str, command: str | None) -> WorkerGroupDriver:
    if name == "noop":
        return NoopDriver()
    if not command:
        raise ValueError("--worker-command is required with --driver subprocess")
    try:
        return SubprocessDriver(shlex.split(command))
    except ValueError as error:  # shlex: "No closing quotation"
        raise ValueError(f"--worker-command {command!r}: {error}") from None


__all__ = ["main", "parser"]

"""``holdfast-broker``: run a broker until SIGTERM or SIGINT.

    holdfast-broker --listen 127.0.0.1:7700 --store memory --dedup-window 300

Once it serves, the broker logs one line ``listening on HOST:PORT`` (with the
real port when ``--listen`` asks for port 0) to stderr. SIGTERM or SIGINT stop it
gracefully and it exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from holdfast.broker.config import BrokerConfig, split_host_port
from holdfast.broker.server import Broker
from holdfast.broker.store import parse_store_spec

log = logging.getLogger("holdfast.broker")

T = TypeVar("T")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``holdfast-broker``."""
    defaults = BrokerConfig()
    parser = argparse.ArgumentParser(
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
        help="where queues are kept: memory (default: %(default)s)",
    )
    parser.add_argument(
        "--dedup-window",
        default=defaults.dedup_window,
        type=_argument(_positive_float),
        metavar="SECONDS",
        help="how long a queue remembers accepted GUIDs (default: %(default)s)",
    )
    parser.add_argument(
        "--max-payload-bytes",
        default=defaults.max_payload_bytes,
        type=_argument(_positive_int),
        metavar="BYTES",
        help="largest payload a PUT may carry (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="(default: %(default)s)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    """The ``BrokerConfig`` parsed command-line arguments describe."""
    return BrokerConfig(
        listen=args.listen,
        store=args.store,
        dedup_window=args.dedup_window,
        max_payload_bytes=args.max_payload_bytes,
    )


async def serve(config: BrokerConfig) -> int:
    """Run a broker until SIGTERM or SIGINT, then stop it gracefully; the exit code."""
    broker = Broker(config)
    try:
        await broker.start()
    except OSError as error:
        log.error("%s", error)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await broker.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``holdfast-broker`` and ``python -m holdfast.broker``."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT, stream=sys.stderr)
    try:
        config = config_from_args(args)
    except ValueError as error:
        log.error("invalid configuration: %s", error)
        return 2
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())

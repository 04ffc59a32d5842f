"""``python -m tests.toxiproxy_server --host 127.0.0.1 --port 8474``

Takes the same ``-host`` / ``-port`` options as ``toxiproxy-server``, so a
fixture can start either the same way. Logs ``listening on HOST:PORT`` to
stderr once the API answers; SIGTERM or SIGINT stop it (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from tests.toxiproxy_server.api import Toxiproxy

log = logging.getLogger("toxiproxy_server")


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--host``/``-host``, ``--port``/``-port``)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.toxiproxy_server",
        description="A Toxiproxy-API-compatible TCP fault injector for the Holdfast tests.",
    )
    parser.add_argument("--host", "-host", default="127.0.0.1", help="(default: %(default)s)")
    parser.add_argument(
        "--port", "-port", type=int, default=8474, help="API port; 0 picks a free one"
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
    )
    return parser


async def serve(host: str, port: int) -> int:
    """Serve the API until SIGTERM or SIGINT; the exit code."""
    toxiproxy = Toxiproxy()
    # Before listening: whoever sees the port open may signal at once.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        server = await asyncio.start_server(toxiproxy.serve_http, host, port, reuse_address=True)
    except OSError as error:
        log.error("cannot listen on %s:%d: %s", host, port, error)
        return 1
    bound = server.sockets[0].getsockname()[1]
    log.info("listening on %s:%d", host, bound)
    await stop.wait()
    server.close()
    toxiproxy.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    return asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    sys.exit(main())

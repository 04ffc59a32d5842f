"""The Prometheus ``/metrics`` endpoint of the broker and the proxy: one registry per
server (so several can run in one process, as in tests), served on its own thread.
Imported only when a ``--metrics-port`` is given: prometheus_client is not loaded
otherwise."""

from __future__ import annotations

import errno
import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

METRICS_HOST = "127.0.0.1"
"""The metrics endpoint only listens locally."""


class MetricsServer:
    """A ``/metrics`` HTTP endpoint on its own thread, over one registry."""

    def __init__(self, collector: Collector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def start(self, port: int, host: str = METRICS_HOST) -> str:
        """Serve on ``host:port`` (0 picks a free port); the bound ``HOST:PORT``."""
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            why = "the port is in use" if error.errno == errno.EADDRINUSE else error.strerror
            raise OSError(
                f"cannot serve metrics on {host}:{port} (--metrics-port): {why}"
            ) from None
        self.address = f"{host}:{self._server.server_port}"
        return self.address

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

"""The HTTP endpoint of the broker and the proxy: Prometheus ``/metrics``, and
``/healthz`` (the process serves HTTP: 200) and ``/readyz`` (200 while the server
takes sessions, 503 otherwise) for orchestrators. One registry per server (so
several can run in one process, as in tests), served on its own thread. Imported only
when ``--metrics-port`` or ``--metrics-listen`` is given: prometheus_client is not
loaded otherwise."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.registry import Collector

METRICS_HOST = "127.0.0.1"
"""Where ``--metrics-port`` listens (``--metrics-listen`` names its own host)."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on their own thread, over one registry."""

    def __init__(self, collector: Collector, ready: Callable[[], bool] = lambda: True) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._ready = ready
        self._metrics = make_wsgi_app(self.registry)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def start(self, port: int, host: str = METRICS_HOST, flag: str = "--metrics-port") -> str:
        """Serve on ``host:port`` (0 picks a free port); the bound ``HOST:PORT``."""
        try:
            server = make_server(
                host, port, self._app, server_class=_Server, handler_class=_QuietHandler
            )
        except OSError as error:
            why = "the port is in use" if error.errno == errno.EADDRINUSE else error.strerror
            raise OSError(f"cannot serve metrics on {host}:{port} ({flag}): {why}") from None
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="holdfast-metrics", daemon=True
        )
        self._thread.start()
        self.address = f"{host}:{server.server_port}"
        return self.address

    def _app(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _text(start, "200 OK", b"ok\n")
        if path == "/readyz":
            if self._ready():
                return _text(start, "200 OK", b"ready\n")
            return _text(start, "503 Service Unavailable", b"not ready\n")
        if path in ("/metrics", "/"):
            body: Iterable[bytes] = self._metrics(environ, start)
            return body
        return _text(start, "404 Not Found", b"not found: /metrics, /healthz, /readyz\n")

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None


def _text(start: Callable[..., Any], status: str, body: bytes) -> list[bytes]:
    start(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [body]

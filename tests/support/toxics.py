"""Network faults through Toxiproxy: the server process, links and toxics.

The tests drive faults only through the ``toxiproxy-python`` client, so they run
unchanged against the real ``toxiproxy-server`` (used when it is on ``PATH`` or
named by ``$TOXIPROXY_SERVER``) and against ``tests.toxiproxy_server``::

    with ToxiproxyServer() as server:
        client = server.client()                # a toxiproxy.Toxiproxy
        link = new_link(client, "broker", broker.address)
        Session(link_address(link))             # the SDK goes through the link
        with toxic(link, "timeout", timeout=0): # a black hole while in the block
            ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from toxiproxy import Toxiproxy

READY_TIMEOUT = 20.0
"""Seconds the server may take to answer its API."""


def real_server() -> str | None:
    """The real ``toxiproxy-server`` to use: ``$TOXIPROXY_SERVER``, else one on PATH."""
    return os.environ.get("TOXIPROXY_SERVER") or shutil.which("toxiproxy-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ToxiproxyServer:
    """A Toxiproxy server subprocess on 127.0.0.1, stopped by PID.

    It is the real server (``real_server()``) if there is one and ``prefer_real``,
    else ``python -m tests.toxiproxy_server``; both take ``-host`` and ``-port``.
    ``log`` receives the server's output (so its pipe never fills).
    """

    def __init__(self, prefer_real: bool = True, log: Path | None = None) -> None:
        self.command = real_server() if prefer_real else None
        self.host = "127.0.0.1"
        self.port = 0
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def is_real(self) -> bool:
        """Whether this is the Go ``toxiproxy-server``."""
        return self.command is not None

    @property
    def pid(self) -> int:
        """The server's process id."""
        if self._proc is None:
            raise RuntimeError("the server was never started")
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, or ``None`` while running (or before the start)."""
        return None if self._proc is None else self._proc.poll()

    def start(self) -> Self:
        """Start the server on a free port and wait until its API answers."""
        self.port = free_port()
        program = (
            [self.command]
            if self.command is not None
            else [sys.executable, "-m", "tests.toxiproxy_server"]
        )
        out = (
            open(self.log, "ab")  # noqa: SIM115 - handed to the child, closed below
            if self.log is not None
            else subprocess.DEVNULL
        )
        try:
            self._proc = subprocess.Popen(
                [*program, "-host", self.host, "-port", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                cwd=Path(__file__).resolve().parents[2],  # so `-m tests...` resolves
            )
        finally:
            if not isinstance(out, int):
                out.close()
        deadline = time.monotonic() + READY_TIMEOUT
        # Not client.running(): the client's address is global, and this may be a
        # second server that must not take it over.
        while not _accepts(self.host, self.port):
            if self._proc.poll() is not None:
                raise RuntimeError(f"toxiproxy server exited with {self._proc.returncode}")
            if time.monotonic() >= deadline:
                self.stop()
                raise RuntimeError(f"toxiproxy server did not listen within {READY_TIMEOUT} s")
            time.sleep(0.05)
        return self

    def client(self) -> Any:
        """A ``toxiproxy.Toxiproxy`` client pointed at this server.

        The client keeps its address in a class attribute, so every client in the
        process talks to the last server this was called for.
        """
        client = Toxiproxy()
        client.update_api_consumer(self.host, self.port)
        return client

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after 5 s) and wait for it to exit."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _accepts(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0


def new_link(client: Any, name: str, upstream: str) -> Any:
    """A new Toxiproxy proxy (a ``toxiproxy.Proxy``) to ``upstream`` on a free port;
    its name is ``name`` made unique."""
    return client.create(upstream=upstream, name=f"{name}-{uuid.uuid4().hex[:8]}")


def link_address(link: Any) -> str:
    """The ``HOST:PORT`` clients connect to, to go through ``link``."""
    listen: str = link.listen
    return listen


def add_toxic(
    link: Any,
    kind: str,
    stream: str = "downstream",
    toxicity: float = 1.0,
    name: str | None = None,
    **attributes: int,
) -> str:
    """Add a toxic to ``link``; return its name (``<type>_<stream>`` by default)."""
    name = name or f"{kind}_{stream}"
    link.add_toxic(type=kind, stream=stream, toxicity=toxicity, name=name, attributes=attributes)
    return name


@contextlib.contextmanager
def toxic(
    link: Any,
    kind: str,
    stream: str = "downstream",
    toxicity: float = 1.0,
    name: str | None = None,
    **attributes: int,
) -> Iterator[str]:
    """A toxic on ``link`` for the duration of the block (removed however it ends)."""
    name = add_toxic(link, kind, stream, toxicity, name, **attributes)
    try:
        yield name
    finally:
        link.destroy_toxic(name)


@contextlib.contextmanager
def down(*links: Any) -> Iterator[None]:
    """``links`` disabled (connections closed, new ones refused) during the block."""
    try:
        for link in links:
            link.disable()
        yield
    finally:
        for link in links:
            link.enable()

"""Run a broker or a proxy as a subprocess, the way users run them
(``python -m holdfast.broker``, ``python -m holdfast.proxy``).

    with BrokerProcess(["--dedup-window", "1.5"]) as broker:
        Session(broker.address)  # "127.0.0.1:PORT"
        broker.kill()            # SIGKILL
        broker.restart()         # same arguments, same port

The server's stderr is read by a thread for the whole life of the process, so the
pipe never fills; the last lines are kept for error messages.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Self

READY_TIMEOUT = 20.0
"""Seconds a server may take to log ``listening on``."""

STOP_TIMEOUT = 10.0
"""Seconds a server may take to exit after SIGTERM or SIGKILL."""

_LISTENING = re.compile(r"listening on (?P<host>\S+):(?P<port>\d+)")


class ServerProcess:
    """A Holdfast server subprocess on ``127.0.0.1`` (see ``BrokerProcess``, ``ProxyProcess``).

    ``args`` are extra command-line arguments (not ``--listen``). ``port`` 0 lets the
    server pick a free port; ``restart()`` then reuses the port it bound first.
    """

    module = ""
    """The module ``python -m`` runs."""

    def __init__(self, args: Sequence[str] = (), port: int = 0) -> None:
        self.args: list[str] = list(args)
        self.command_prefix: list[str] = []
        """Run the server under this (``valgrind ...`` in ``bench/columnar.py``)."""
        self.ready_timeout = READY_TIMEOUT
        self._requested_port = port
        self._port = 0
        self._host = "127.0.0.1"
        self._proc: subprocess.Popen[str] | None = None
        self._lines: deque[str] = deque(maxlen=200)
        self._history: list[str] = []
        self._lines_lock = threading.Lock()
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and wait until it listens; return ``self``."""
        if self.running:
            raise RuntimeError(f"{self.module} already running (pid {self.pid})")
        port = self._port or self._requested_port
        command = [
            *self.command_prefix,
            sys.executable,
            "-m",
            self.module,
            "--listen",
            f"127.0.0.1:{port}",
            *self.args,
        ]
        self._ready = threading.Event()
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            # Its own process group: a Ctrl-C meant for pytest does not hit it first.
            start_new_session=True,
        )
        self._reader = threading.Thread(
            target=self._drain, args=(self._proc, self._ready), daemon=True
        )
        self._reader.start()
        self.wait_ready(self.ready_timeout)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until the server logged ``listening on HOST:PORT``; raise ``RuntimeError``
        with its output if it exits or does not get there within ``timeout`` seconds."""
        proc = self._require()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if proc.poll() is not None:
                if self._reader is not None:
                    self._reader.join(2)  # collect its last words
                raise RuntimeError(
                    f"{self.module} exited with {proc.returncode} before it listened:\n"
                    + self.output
                )
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{self.module} did not listen within {timeout} s:\n{self.output}"
                )

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM the server and wait for it to exit; return its exit code. If it is
        still running after ``timeout`` seconds, SIGKILL it and raise ``TimeoutError``."""
        proc = self._require()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(
                f"{self.module} did not exit within {timeout} s of SIGTERM:\n{self.output}"
            ) from None
        self._collect_last_words()
        return code

    def kill(self) -> None:
        """SIGKILL the server (by PID) and wait for it to be gone."""
        proc = self._require()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT)
        self._collect_last_words()

    def _collect_last_words(self) -> None:
        """Wait (briefly) for the reader to take what the exited server wrote last: the
        process can be reaped before its last lines are read from the pipe, and a test
        that checks them (``"stopped" in output``) would see them missing."""
        if self._reader is not None:
            self._reader.join(2)

    def restart(self) -> None:
        """Start the server again with the same arguments on the port it bound first.
        A server still running is terminated first."""
        if self.running:
            self.terminate()
        # The old process's listening socket is gone once it was reaped, but give the
        # kernel a few tries in case the port is momentarily held.
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self.start()
                return
            except RuntimeError:
                if self.running or time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        """Stop the server however it takes (SIGTERM, then SIGKILL); never raises for a
        server that is already gone."""
        if self._proc is None or self._proc.poll() is not None:
            return
        # On TimeoutError terminate() has killed it.
        with contextlib.suppress(TimeoutError):
            self.terminate(timeout=5.0)

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- what it is -----------------------------------------------------------------

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` (the port actually bound)."""
        if not self._port:
            raise RuntimeError(f"{self.module} has not listened yet")
        return f"{self._host}:{self._port}"

    @property
    def port(self) -> int:
        """The bound port (0 before the first start)."""
        return self._port

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._require().pid

    @property
    def running(self) -> bool:
        """Whether the process exists and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code, or ``None`` while running (or before the first start)."""
        return None if self._proc is None else self._proc.poll()

    @property
    def output(self) -> str:
        """The last lines the server wrote to stderr (of every run)."""
        with self._lines_lock:
            return "".join(self._lines)

    def count(self, text: str) -> int:
        """How many lines the server wrote (in every run, unlike ``output``) contain
        ``text``: tests count events such as the proxy's upstream ``ConnectionLost``."""
        with self._lines_lock:
            return sum(text in line for line in self._history)

    def lines_with(self, text: str) -> list[str]:
        """The lines the server wrote (in every run) that contain ``text``."""
        with self._lines_lock:
            return [line for line in self._history if text in line]

    def _require(self) -> subprocess.Popen[str]:
        if self._proc is None:
            raise RuntimeError("the server was never started")
        return self._proc

    def _drain(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._lines_lock:
                self._lines.append(line)
                self._history.append(line)
            if not ready.is_set() and (match := _LISTENING.search(line)):
                self._host = match["host"]
                self._port = int(match["port"])
                ready.set()
        proc.stderr.close()


class BrokerProcess(ServerProcess):
    """A ``holdfast-broker`` subprocess; ``args`` are its options besides ``--listen``."""

    module = "holdfast.broker"


class ProxyProcess(ServerProcess):
    """A ``holdfast-proxy`` subprocess; pass ``["--upstream", broker.address]``."""

    module = "holdfast.proxy"

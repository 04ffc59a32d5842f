"""A ``redis-server`` of the test's own, on a free 127.0.0.1 port, stopped by PID.

with RedisServer(tmp_path) as redis:     # AOF on by default
    BrokerProcess(["--store", redis.url])
    redis.restart()                      # same port, same data directory
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.support.waiting import wait_until

REDIS_SERVER = shutil.which("redis-server") or "redis-server"
REDIS_CLI = shutil.which("redis-cli") or "redis-cli"


def free_port(cluster: bool = False) -> int:
    """A TCP port on 127.0.0.1 nothing listens on; with ``cluster``, one whose cluster bus
    port (+10000) is free and valid too (ephemeral ports are often above 55535)."""
    if not cluster:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port
    for _ in range(200):
        candidate = random.randrange(20000, 50000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", candidate))
                b.bind(("127.0.0.1", candidate + 10000))
        except OSError:
            continue
        return candidate
    raise RuntimeError("no free port pair for a cluster node")


class RedisServer:
    """One ``redis-server`` process (``extra`` are more server arguments)."""

    def __init__(
        self, directory: Path, *, aof: bool = True, extra: tuple[str, ...] = (), port: int = 0
    ) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port(cluster="--cluster-enabled" in extra)
        self.aof = aof
        self.extra = extra
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The broker's ``--store`` value for this server."""
        return f"redis://{self.address}"

    def start(self) -> Self:
        """Start the server and wait until it answers PING."""
        command = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--save", "",
            "--appendonly", "yes" if self.aof else "no", "--appendfsync", "always",
            *self.extra,
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        wait_until(lambda: self.cli("PING") == "PONG", 15, f"redis-server on {self.port}")
        return self

    @property
    def pid(self) -> int:
        """The server's process id."""
        if self._process is None:
            raise RuntimeError("the server was never started")
        return self._process.pid

    def cli(self, *args: str) -> str:
        """Run ``redis-cli -p PORT ARGS...``; its output (empty if it cannot connect)."""
        done = subprocess.run(
            [REDIS_CLI, "-p", str(self.port), *args], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip()

    def kill(self) -> None:
        """SIGKILL the server by PID and reap it."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait(10)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 10 s) by PID."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self, *, wipe: bool = False) -> None:
        """Stop and start again on the same port; ``wipe`` deletes its data first (a
        restart without persistence)."""
        self.kill()
        if wipe:
            for child in self.directory.iterdir():
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        deadline = time.monotonic() + 10
        while True:
            try:
                self.start()
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(Exception):
            self.stop()


@contextlib.contextmanager
def redis_cluster(base: Path, primaries: int = 3, aof: bool = True) -> Iterator[list[RedisServer]]:
    """``primaries`` Redis Cluster primaries in folders under ``base``, the slots spread
    over them by ``redis-cli --cluster create``; stopped (by PID) on exit."""
    servers = [
        RedisServer(
            base / f"n{i}",
            aof=aof,
            extra=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
        )
        for i in range(primaries)
    ]
    try:
        for server in servers:
            server.start()
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *(s.address for s in servers),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        wait_until(
            lambda: all("cluster_state:ok" in s.cli("CLUSTER", "INFO") for s in servers),
            30,
            "the cluster",
        )
        yield servers
    finally:
        for server in servers:
            server.stop()

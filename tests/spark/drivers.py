"""Runs ``tests/spark/driver.py`` (or another driver program) as a Spark driver
subprocess that a test can SIGKILL.

The driver runs in a process group of its own, with the JVM PySpark launches for it,
so ``kill()`` SIGKILLs the whole driver (Python and JVM, as a crashed driver machine)
by its group id, which is the driver's PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Self

from tests.support.waiting import wait_until

DRIVER = Path(__file__).with_name("driver.py")
ROOT = Path(__file__).resolve().parents[2]


class DriverProcess:
    """One run of ``script`` (default ``driver.py``); its stdout and stderr are kept
    as text."""

    def __init__(self, args: Sequence[str], script: Path = DRIVER) -> None:
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONPATH": str(ROOT),
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._lock = threading.Lock()
        self._out: list[str] = []
        self._err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self._out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self._err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            with self._lock:
                into.append(line)

    @property
    def stdout(self) -> str:
        with self._lock:
            return "".join(self._out)

    @property
    def stderr(self) -> str:
        with self._lock:
            return "".join(self._err)

    def wait_for(self, text: str, timeout: float) -> None:
        """Wait until the driver printed ``text`` on stdout (fail if it exits first)."""

        def seen() -> bool:
            if self.proc.poll() is not None and text not in self.stdout:
                raise AssertionError(
                    f"the driver exited {self.proc.returncode} before {text!r}:\n"
                    f"{self.stderr[-3000:]}"
                )
            return text in self.stdout

        wait_until(seen, timeout, f"the driver to print {text!r}")

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the driver gracefully (SIGTERM to the driver's Python process, which
        stops its query and SparkSession) and wait for it to exit 0."""
        os.kill(self.proc.pid, signal.SIGTERM)
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(30)
        assert code == 0, f"the driver exited {code} on SIGTERM:\n{self.stderr[-3000:]}"

    def kill(self) -> None:
        """SIGKILL the driver's process group (the driver and its JVM) and reap it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        for reader in self._readers:
            reader.join(30)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

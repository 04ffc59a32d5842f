"""A Spark standalone cluster for tests: one Master and Workers on distinct loopback
addresses, every JVM started from the pip ``pyspark`` package and stopped by PID.

Why not ``local[N]`` or ``local-cluster``: there every executor is on one host, and
Spark never launches a speculative copy of a task on a host where that task already
runs. Linux routes all of 127.0.0.0/8 to loopback, so Workers bound to 127.0.0.1 and
127.0.0.2 are two hosts to Spark, on one machine.

    with StandaloneCluster(tmp_path) as cluster:
        SparkSession.builder.master(cluster.master_url)...

Each Master and Worker runs in a process group of its own; the executors a Worker
launches (and their JVM children) are in the Worker's group, so stopping a group ends
the Worker and everything it started. PySpark's ``pyspark.daemon`` puts itself in a
group of its own but exits when its executor's pipe closes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.spark.helpers import JVM_OPTIONS
from tests.support.redis_server import free_port
from tests.support.waiting import wait_until

WORKER_HOSTS = ("127.0.0.1", "127.0.0.2")
"""One Worker per address: two hosts as far as Spark's scheduler knows."""

START_TIMEOUT = 90.0
"""Seconds the Master may take to be elected, and each Worker to register: a JVM
start is seconds on an idle machine, far more on two cores shared with other work."""

STOP_TIMEOUT = 15.0
"""Seconds a Master or Worker (and its executors) may take to exit on SIGTERM, before
its process group is SIGKILLed."""

DAEMON_OPTIONS = f"{JVM_OPTIONS} -Dspark.master.rest.enabled=false"
"""Master and Worker JVM options: the quick JVM settings of ``helpers``, and no REST
submission server (it would bind port 6066 on every address)."""


def pyspark_home() -> Path:
    """The ``pyspark`` package directory: a Spark distribution (``bin/spark-class``,
    ``jars/``) as pip installs it."""
    import pyspark

    return Path(pyspark.__path__[0])


class StandaloneCluster:
    """One Master on 127.0.0.1 and a Worker per address of ``hosts`` (``cores`` cores,
    ``memory`` each); logs and work directories under ``work_dir``.

    Entering starts the Master, waits until it is leader, starts the Workers and waits
    until every one has registered; leaving stops them all (also when a start failed).
    """

    def __init__(
        self,
        work_dir: Path,
        hosts: Sequence[str] = WORKER_HOSTS,
        cores: int = 1,
        memory: str = "1g",
    ) -> None:
        self.work_dir = work_dir
        self.hosts = list(hosts)
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        """What a driver passes to ``SparkSession.builder.master``."""
        self._procs: list[subprocess.Popen[bytes]] = []
        self._master_log = work_dir / "master.log"

    def _start(self, name: str, host: str, args: Sequence[str]) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(pyspark_home()),
            # The address the JVM binds (RPC, UI); a Worker's executors bind and
            # report the Worker's --host.
            "SPARK_LOCAL_IP": host,
            "SPARK_DAEMON_JAVA_OPTS": DAEMON_OPTIONS,
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_WORKER_DIR": str(self.work_dir / name),
            # Executors start Python workers with this interpreter: the venv, where
            # holdfast is installed.
            "PYSPARK_PYTHON": sys.executable,
        }
        with open(self.work_dir / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                [str(pyspark_home() / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._procs.append(proc)

    def _log(self, name: str) -> str:
        path = self.work_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _wait_for(self, text: str, what: str) -> None:
        def seen() -> bool:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"a Spark daemon exited {proc.returncode} before {what}:\n"
                        + "\n".join(self._log(name)[-2000:] for name in self.names)
                    )
            return text in self._log("master")

        wait_until(seen, START_TIMEOUT, what)

    @property
    def names(self) -> list[str]:
        """The daemons' names: ``master``, ``worker-1``, ``worker-2``...; each logs to
        ``work_dir/<name>.log`` and works in ``work_dir/<name>``."""
        return ["master", *(f"worker-{n}" for n in range(1, len(self.hosts) + 1))]

    def start(self) -> Self:
        """Start the Master and the Workers; return once every Worker registered."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._start(
            "master",
            "127.0.0.1",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--webui-port", "0"),
            ],
        )
        self._wait_for("I have been elected leader", "the Spark master to be elected")
        for name, host in zip(self.names[1:], self.hosts, strict=True):
            (self.work_dir / name).mkdir(exist_ok=True)
            self._start(
                name,
                host,
                [
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", host, "--port", "0", "--webui-port", "0"),
                    *("--cores", str(self.cores), "--memory", self.memory),
                    *("--work-dir", str(self.work_dir / name)),
                    self.master_url,
                ],
            )
        for host in self.hosts:
            self._wait_for(f"Registering worker {host}:", f"the Spark worker on {host}")
        return self

    def stop(self) -> None:
        """SIGTERM every daemon's process group (a Worker's shutdown kills its
        executors), then SIGKILL what is left after ``STOP_TIMEOUT`` seconds."""
        for proc in reversed(self._procs):
            _signal_group(proc, signal.SIGTERM)
        for proc in reversed(self._procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT)
            # Executors outlive a Worker killed before its shutdown hook ran.
            _signal_group(proc, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT)
        self._procs.clear()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(proc.pid, signum)

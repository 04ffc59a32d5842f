"""One local SparkSession per test process (each xdist worker), and the JVM it runs on
stopped by PID.

Spark needs Java: ``make test`` installs a JRE when there is no ``java`` on PATH (or
``$JAVA_HOME``); without one the tests that use the ``spark`` fixture fail, saying
so, rather than skip. Executors are Python worker processes started by the JVM;
``PYSPARK_PYTHON`` points them at this interpreter (the venv), so they import
``holdfast.sdk`` from the editable install.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.helpers import JVM_OPTIONS, NO_JAVA_REASON, java_available

MASTER = "local[2,4]"
"""Two task slots; in local mode the second number is ``spark.task.maxFailures``, so a
failed task is retried (up to 4 attempts) as on a cluster."""

JVM_STOP_TIMEOUT = 20.0
"""Seconds the JVM may take to exit once its driver pipe is closed, before SIGKILL."""


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A ``local[2,4]`` SparkSession shared by every test of this process (a JVM start
    costs 15-40 s on two busy cores, and the tests share nothing through it but the
    JVM: each writes its own queue, run id and checkpoint). At teardown the session is
    stopped and its JVM process ended by PID."""
    if not java_available():
        # Never a silent skip: `make test` installs Java when it is missing.
        pytest.fail(NO_JAVA_REASON + " (make test installs it: see the Makefile's java step)")
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYSPARK_PYTHON", sys.executable)
        env.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
        session = (
            SparkSession.builder.master(MASTER)
            .appName("holdfast-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "4")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        gateway = SparkContext._gateway
        try:
            yield session
        finally:
            session.stop()
            _stop_jvm(gateway)
            # A later session (another pytest run in this process) launches a JVM
            # of its own rather than reuse a dead one.
            SparkContext._gateway = None
            SparkContext._jvm = None


@pytest.fixture(autouse=True)
def _nothing_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the shared session: stop its streaming queries and
    cancel its jobs, so that a test that failed or timed out half way through a job
    leaves no tasks behind to hold the task slots of the next test (they would retry
    against a broker already stopped)."""
    yield
    if "spark" not in request.fixturenames:
        return
    session = request.getfixturevalue("spark")
    for query in session.streams.active:
        with contextlib.suppress(Exception):
            query.stop()
    session.sparkContext.cancelAllJobs()


def _stop_jvm(gateway: Any) -> None:
    """End the gateway JVM PySpark launched: closing its stdin is how PySpark tells it
    to exit (it dies on the broken pipe, and its Python workers with it); SIGKILL by
    PID if it has not within ``JVM_STOP_TIMEOUT`` seconds."""
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is None:
        return
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(JVM_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(JVM_STOP_TIMEOUT)

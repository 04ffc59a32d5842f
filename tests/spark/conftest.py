"""One local SparkSession per test module, and the JVM it runs on stopped by PID.

Spark needs Java: ``make test`` installs a JRE when there is no ``java`` on PATH (or
``$JAVA_HOME``); without one the tests that use the ``spark`` fixture fail, saying
so, rather than skip. Executors are Python worker processes started by the JVM;
``PYSPARK_PYTHON`` points them at this interpreter (the venv), so they import
``holdfast.sdk`` from the editable install.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.helpers import NO_JAVA_REASON, java_available

MASTER = "local[2,4]"
"""Two task slots; in local mode the second number is ``spark.task.maxFailures``, so a
failed task is retried (up to 4 attempts) as on a cluster."""

JVM_STOP_TIMEOUT = 20.0
"""Seconds the JVM may take to exit once its driver pipe is closed, before SIGKILL."""


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A ``local[2,4]`` SparkSession shared by the tests of one module (JVM startup
    costs seconds). At teardown the session is stopped and its JVM process ended by PID."""
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
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        gateway = SparkContext._gateway
        try:
            yield session
        finally:
            session.stop()
            _stop_jvm(gateway)
            # The next module launches a JVM of its own rather than reuse a dead one.
            SparkContext._gateway = None
            SparkContext._jvm = None


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

"""For the Spark tests: is there a JVM to run Spark on, and draining what the sink wrote."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

NO_JAVA_REASON = "the Spark tests need Java 17+: no `java` on PATH and no $JAVA_HOME"

JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The test JVMs' options (``spark.driver.extraJavaOptions``; in local mode the
executors are that JVM): the quick compiler only and one GC thread. A test's JVM lives
for seconds to minutes and moves little data; on two busy cores the optimizing
compiler's and the parallel GC's threads cost more CPU than they win back (a session
start and a 200,000-row job took 34 s + 16 s with these, 136 s + 82 s without)."""


def java_available() -> bool:
    """Whether PySpark can launch a JVM: ``$JAVA_HOME/bin/java`` or ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return True
    return shutil.which("java") is not None

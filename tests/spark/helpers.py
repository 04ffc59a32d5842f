"""For the Spark tests: is there a JVM to run Spark on, and draining what the sink wrote."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

NO_JAVA_REASON = "the Spark tests need Java 17+: no `java` on PATH and no $JAVA_HOME"


def java_available() -> bool:
    """Whether PySpark can launch a JVM: ``$JAVA_HOME/bin/java`` or ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return True
    return shutil.which("java") is not None

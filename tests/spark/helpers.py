"""For the Spark tests: is there a JVM to run Spark on, and draining what the sink wrote."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from holdfast.sdk import Message, QueueOptions, Session
from tests.support.recorder import MessageRecorder
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

NO_JAVA_REASON = "the Spark tests need Java 17+: no `java` on PATH and no $JAVA_HOME"


def java_available() -> bool:
    """Whether PySpark can launch a JVM: ``$JAVA_HOME/bin/java`` or ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return True
    return shutil.which("java") is not None


def drain_messages(address: str, uri: str, expected: int, timeout: float = 60.0) -> list[Message]:
    """Consume and confirm until ``expected`` messages arrived and the queue stays quiet
    for half a second (so a duplicate right behind them would be seen); return them all."""
    received = MessageRecorder()
    with Session(address, options=FAST) as session:
        session.open_queue(
            uri,
            read=True,
            on_message=received,
            options=QueueOptions(max_unconfirmed_messages=5000),
        )
        wait_until(lambda: len(received) >= expected, timeout, f"{expected} messages")
        settle = time.monotonic() + 0.5
        last = len(received)
        while time.monotonic() < settle:
            time.sleep(0.05)
            if len(received) != last:
                last, settle = len(received), time.monotonic() + 0.5
    with received.lock:
        return list(received.messages)

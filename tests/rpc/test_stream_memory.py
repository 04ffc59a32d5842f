"""Issue #35's acceptance: a 200 MB data stream each way through a proxy that is killed
mid-stream in each direction; the content checked by digest at both ends and the
peak memory of every process (caller, worker, proxy, broker) bounded far below the
stream's size.

The caller and the worker are processes of their own (``tests.rpc.stream_main``), so
that their peak resident size (``VmHWM``) is theirs alone. The proxy is killed when
the worker has read 64 MiB of the request stream, and again when the caller has read
64 MiB of the reply stream; it is restarted on the same port each time.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.rpc.stream_main import MB
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import unique_uri

SIZE = 200 * MB
KILL_AT = 64 * MB
PEAK_GROWTH = 100 * MB
"""How much a process's peak resident size may grow over the call: half the stream."""

REPO = Path(__file__).resolve().parents[2]


def vm_hwm(pid: int) -> int:
    """Peak resident bytes of process ``pid`` so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


class End:
    """One end (``stream_main``) as a subprocess whose lines arrive on a queue; stopped
    by PID."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.rpc.stream_main", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        """Every line so far, those ``wait_for`` skipped included."""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.seen.append(line.strip())
            self.lines.put(line.strip())

    def wait_for(self, test: str, timeout: float) -> str:
        """The first line starting with ``test`` (earlier lines are skipped)."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no {test!r} line within {timeout} s") from None
            if line.startswith(test):
                return line

    def read_past(self, at: int, timeout: float) -> None:
        """Wait until the end reports it has read ``at`` bytes of its stream."""
        while True:
            line = self.wait_for("read ", timeout)
            if int(line.split()[1]) >= at:
                return

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("flavour", ["threaded", "asyncio"])
def test_200_mb_each_way_through_a_proxy_killed_mid_stream_both_ways(flavour: str) -> None:
    uri = unique_uri("streams-200mb")
    extra = ["--aio"] if flavour == "asyncio" else []
    with (
        BrokerProcess(["--store", "memory"]) as broker,
        ProxyProcess(["--upstream", broker.address]) as proxy,
    ):
        worker = End("worker", proxy.address, uri, str(SIZE), *extra)
        caller: End | None = None
        try:
            worker.wait_for("ready", 30)
            start = {"worker": vm_hwm(worker.proc.pid), "broker": vm_hwm(broker.pid)}
            caller = End("caller", proxy.address, uri, str(SIZE), *extra)
            worker.read_past(KILL_AT, 120)  # the request stream is a third through
            proxy_peaks = [vm_hwm(proxy.pid)]
            proxy.kill()
            proxy.restart()
            caller.read_past(KILL_AT, 180)  # the reply stream is a third through
            proxy_peaks.append(vm_hwm(proxy.pid))
            proxy.kill()
            proxy.restart()
            result = json.loads(caller.wait_for("{", 180))
            peaks = {
                "caller": vm_hwm(caller.proc.pid),
                "worker": vm_hwm(worker.proc.pid),
                "broker": vm_hwm(broker.pid),
                "proxy": max(*proxy_peaks, vm_hwm(proxy.pid)),
            }
        finally:
            if caller is not None:
                caller.stop()
            worker.stop()
    assert result["request_read"] == result["request_expected"]
    assert result["reply_read"] == result["reply_expected"]
    print(f"peak RSS MiB ({flavour}):", {k: round(v / MB) for k, v in peaks.items()})
    assert peaks["worker"] - start["worker"] < PEAK_GROWTH, peaks
    assert peaks["broker"] - start["broker"] < PEAK_GROWTH, peaks
    # The caller and each proxy run are measured from their start (an idle process
    # with the SDK or the proxy imported is 40-60 MiB).
    assert peaks["caller"] < 60 * MB + PEAK_GROWTH, peaks
    assert peaks["proxy"] < 60 * MB + PEAK_GROWTH, peaks

"""Profile the three hops of PUT->ACK through the sidecar with py-spy, side by side.

    .venv/bin/pip install py-spy && .venv/bin/python bench/profile_hops.py

Starts a broker (memory store) and a proxy, records each of the client (this
process), the proxy and the broker for 8 s at 200 Hz while one producer posts
100-byte messages through the proxy, and prints the functions with the most self
time per hop (``bench/PROFILE.md`` has one run's output and what it means).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import harness
import loads

HOPS = ("client", "proxy", "broker")


def record(seconds: int = 8, count: int = 600_000) -> dict[str, Path]:
    """Profile the hops under load; the raw py-spy output file of each."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    outputs = {hop: Path(f"/tmp/holdfast-profile-{hop}.txt") for hop in HOPS}
    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
    ):
        pids = {"client": os.getpid(), "proxy": proxy.pid, "broker": broker.pid}
        recorders = [
            subprocess.Popen(
                [pyspy, "record", "-p", str(pids[hop]), "-d", str(seconds), "-r", "200",
                 "-f", "raw", "-o", str(outputs[hop]), "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for hop in HOPS
        ]  # fmt: skip
        result = loads.produce(proxy.address, "hf://profile/q", count, 100, loads.CpuMeter({}))
        print(f"PUT->ACK through the proxy during the profile: {result.rate:,.0f} msg/s")
        for recorder in recorders:
            recorder.wait(seconds + 30)
    return outputs


def summarize(path: Path, top: int = 10) -> list[tuple[float, str]]:
    """(share of samples, function) with the most self time in a raw py-spy file."""
    self_time: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        leaf = stack.split(";")[-1]
        match = re.match(r"(.*?) \((.*?):\d+\)", leaf)
        name = f"{match.group(1)} ({Path(match.group(2)).name})" if match else leaf
        self_time[name] += int(count)
    return [(count / total, name) for name, count in self_time.most_common(top)]


if __name__ == "__main__":
    for hop, path in record().items():
        print(f"== {hop}")
        for share, name in summarize(path):
            print(f"  {share:6.1%}  {name}")

"""Scale-out on Redis: one broker node against two on the same Redis, for ``make bench``.

Each producer is a process of its own (``python bench/redisscale.py produce ...``),
so that two producers are not two threads sharing one interpreter lock: an earlier
version of this figure ran both in the bench process, which then, not the nodes,
set the two-node rate (0.82-0.85x of one node). The measurement starts a Redis and
two brokers on it (``--store redis://...``), then:

- **saturating**: one producer process posting ``count`` 100-B messages as fast as
  ``post()`` takes them to node A; then one producer per node, ``count / 2`` each, at
  once, all to one queue; ``ROUNDS`` of each, alternating, and their medians. The
  rate is messages over the time from the first ``post()`` to the last ACK of all
  producers;
- **the same offered load**: ``OFFERED`` of the one-node saturating rate, offered
  by one paced producer to node A, then split over two paced producers, one per node.
  Both should carry it in full; CPU per message shows what the second node costs.
- **the control**: two producer processes, both to node A, in the same rounds, saturating
  and paced. Two nodes are two producers *and* two brokers on the host's cores: against
  this run the second node alone is measured, against the one-producer run both at
  once. Paced, a producer wakes once a millisecond whatever its share, so two
  producers send twice the frames of one, each half as full: on a 2-core host (13.8k
  msg/s offered, medians of three rounds, 2026-11-28) one producer to one node carried
  13.8k, two producers to one node 12.4k and two producers to two nodes 12.2k: most of
  what the one-producer comparison loses is the second producer's frames.

The bench never consumes: each run finds the previous runs' messages in Redis, each
two-node round 100k more than the one-node round before it. Purging between runs is
no cure: PURGE of 100k messages is one script that held Redis for 1.7 s (loaded
host) and lapsed the nodes' leases (3 s) in the next run.

Beside each rate: CPU microseconds per message of the producers, the brokers and the
Redis server (``/proc/<pid>/stat``), and Redis commands per message (``INFO stats``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
import loads

from holdfast.sdk import Ack, AckStatus, Session
from tests.support.processes import BrokerProcess
from tests.support.redis_server import RedisServer

OFFERED = 0.4
"""The paced runs offer this share of the one-node saturating rate. Paced, a frame
carries ~1 ms of PUTs, so the scripts' per-frame cost weighs more per message than
when saturated (measured: the broker's CPU per message 2-3x); at 0.6 the one-node
paced run no longer kept up on 2 cores."""
ROUNDS = 3
SIZE = 100
URI = "hf://scale/redis"


@dataclass
class Run:
    """One configuration's figures."""

    nodes: int
    offered: float
    """Messages per second offered in total (0: as fast as ``post()`` takes them)."""
    rate: float
    """Messages ACKed per second, first ``post()`` to last ACK over all producers."""
    not_success: int
    cpu_us: dict[str, float]
    """CPU microseconds per message: producers, brokers, redis (each summed)."""
    commands_per_message: float


def _produce(address: str, uri: str, count: int, rate: float) -> dict[str, Any]:
    """Post ``count`` messages (paced at ``rate`` per second when > 0); timestamps on
    the system-wide monotonic clock, so the parent can join several producers' runs."""
    payload = os.urandom(SIZE)
    done = threading.Event()
    tally = {"acked": 0, "ok": 0}

    def on_ack(ack: Ack) -> None:
        tally["acked"] += 1
        tally["ok"] += ack.status is AckStatus.SUCCESS
        if tally["acked"] == count:
            done.set()

    with Session(address, on_event=lambda event: None) as session:
        queue = session.open_queue(uri, write=True, on_ack=on_ack)
        post = queue.post
        print("ready", flush=True)
        sys.stdin.readline()  # "go": all producers start together
        cpu = time.process_time()
        started = time.monotonic()
        if rate > 0:
            step = 1.0 / rate
            burst = max(1, int(rate / 1000))  # a millisecond's worth per wake-up
            for first in range(0, count, burst):
                due = started + first * step
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                for _ in range(min(burst, count - first)):
                    post(payload)
        else:
            for _ in range(count):
                post(payload)
        if not done.wait(300):
            raise RuntimeError(f"{count - tally['acked']} of {count} PUTs got no ACK in 300 s")
        ended = time.monotonic()
        cpu = time.process_time() - cpu
    return {"started": started, "ended": ended, "ok": tally["ok"], "cpu": cpu, "count": count}


class _Producer:
    """A producer subprocess, ready to go; stopped by PID."""

    def __init__(self, address: str, count: int, rate: float) -> None:
        args = [sys.executable, __file__, "produce", address, URI, str(count), str(rate)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("a bench producer did not start")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=360)
        if self.proc.returncode != 0:
            raise RuntimeError(f"a bench producer failed ({self.proc.returncode})")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _commands(redis: RedisServer) -> int:
    for line in redis.cli("INFO", "stats").splitlines():
        if line.startswith("total_commands_processed:"):
            return int(line.split(":")[1])
    return 0


def _run(redis: RedisServer, nodes: list[BrokerProcess], count: int, offered: float) -> Run:
    """``count`` messages over one producer per entry of ``nodes`` (a node twice: two
    producers to it), together."""
    share = count // len(nodes)
    producers = [_Producer(node.address, share, offered / len(nodes)) for node in nodes]
    try:
        distinct = list({n.pid: n for n in nodes}.values())
        pids = {"redis": redis.pid} | {f"broker{i}": n.pid for i, n in enumerate(distinct)}
        before = {name: loads.cpu_seconds(pid) for name, pid in pids.items()}
        commands = _commands(redis)
        for producer in producers:
            producer.go()
        results = [producer.result() for producer in producers]
    finally:
        for producer in producers:
            producer.stop()
    used = {name: loads.cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    total = share * len(nodes)
    seconds = max(r["ended"] for r in results) - min(r["started"] for r in results)
    brokers = sum(seconds for name, seconds in used.items() if name.startswith("broker"))
    return Run(
        nodes=len(distinct),
        offered=offered,
        rate=total / seconds,
        not_success=total - sum(r["ok"] for r in results),
        cpu_us={
            "producers": sum(r["cpu"] for r in results) / total * 1e6,
            "brokers": brokers / total * 1e6,
            "redis": used["redis"] / total * 1e6,
        },
        commands_per_message=(_commands(redis) - commands) / total,
    )


def measure(count: int, rounds: int = ROUNDS) -> dict[str, Any]:
    """Saturating runs, one node and two alternating, ``rounds`` each; then the paced
    runs at ``OFFERED`` of the one-node median, ``rounds`` of each shape, alternating.
    Medians, and every saturating run; the control (two producers to one node),
    saturating and paced, under ``control``."""
    saturating: dict[int, list[Run]] = {1: [], 2: []}
    control: list[Run] = []
    with tempfile.TemporaryDirectory() as directory:
        redis = RedisServer(Path(directory), extra=("--appendfsync", "everysec")).start()
        try:
            store = ["--store", redis.url]
            with BrokerProcess(list(store)) as a, BrokerProcess(list(store)) as b:
                _run(redis, [a], min(count, 20_000), 0.0)  # warm-up: scripts, queue, caches
                for _ in range(rounds):
                    saturating[1].append(_run(redis, [a], count, 0.0))
                    saturating[2].append(_run(redis, [a, b], count, 0.0))
                    control.append(_run(redis, [a, a], count, 0.0))
                one = harness.median([run.rate for run in saturating[1]])
                shapes = {"one": [a], "two": [a, b], "control": [a, a]}
                paced: dict[str, list[Run]] = {shape: [] for shape in shapes}
                for _ in range(rounds):
                    for shape, nodes in shapes.items():
                        paced[shape].append(_run(redis, nodes, count, one * OFFERED))
        finally:
            redis.stop()
    two = harness.median([run.rate for run in saturating[2]])
    return {
        "one_node": one,
        "two_nodes": two,
        "ratio": two / one,
        "commands_per_message": saturating[1][-1].commands_per_message,
        "cpu_us": {str(n): _median_cpu(runs) for n, runs in saturating.items()},
        "paced": [_median_run(paced["one"]), _median_run(paced["two"])],
        "control": {
            "rate": harness.median([run.rate for run in control]),
            "two_nodes_ratio": two / harness.median([run.rate for run in control]),
            "cpu_us": _median_cpu(control),
            "paced": _median_run(paced["control"]),
            "paced_two_nodes_ratio": _median_rate(paced["two"]) / _median_rate(paced["control"]),
        },
        "paced_ratio": _median_rate(paced["two"]) / _median_rate(paced["one"]),
        "runs": [asdict(run) for runs in saturating.values() for run in runs],
    }


def _median_cpu(runs: list[Run]) -> dict[str, float]:
    return {hop: harness.median([run.cpu_us[hop] for run in runs]) for hop in runs[0].cpu_us}


def _median_rate(runs: list[Run]) -> float:
    return harness.median([run.rate for run in runs])


def _median_run(runs: list[Run]) -> dict[str, Any]:
    """One configuration's rounds as one run: the median rate and CPU per hop, the
    offered load, and the most PUTs any round left without SUCCESS."""
    return asdict(runs[0]) | {
        "rate": _median_rate(runs),
        "cpu_us": _median_cpu(runs),
        "not_success": max(run.not_success for run in runs),
        "commands_per_message": harness.median([run.commands_per_message for run in runs]),
        "rounds": len(runs),
    }


def main() -> int:
    """``measure`` (prints one JSON line a run), or one producer (``produce``)."""
    if len(sys.argv) > 1 and sys.argv[1] == "produce":
        address, uri, count, rate = sys.argv[2:6]
        print(json.dumps(_produce(address, uri, int(count), float(rate))), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    args = parser.parse_args()
    print(json.dumps(measure(args.count)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The proxy's relay alone, before/after: instructions and CPU per message in the proxy.

    .venv/bin/python bench/relay_hop.py [--baseline-ref REF] [--count 30000] [--runs 3]

For this tree and the baseline tree (``git archive``d, imported through ``PYTHONPATH``
as ``bench/columnar.py`` does), in child processes:

- ``callgrind``: the proxy under ``valgrind --tool=callgrind`` (broker and client at full
  speed), counters zeroed after a warm-up and dumped after ``count`` PUT->ACK messages,
  then after ``count`` PUSH->CONFIRM messages: instructions per message, which do not
  swing with the load of a shared host;
- ``cpu``: the proxy's CPU microseconds per message (``/proc/<pid>/stat``) over PUT->ACK
  and PUSH->CONFIRM runs, the two trees alternating ``runs`` times.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import columnar

SIZE = 100


def child_callgrind(count: int) -> dict[str, Any]:
    """Instructions per message in the proxy: PUT->ACK, then PUSH->CONFIRM."""
    import harness
    import loads

    from tests.support.processes import BrokerProcess, ProxyProcess

    scratch = Path(tempfile.mkdtemp(prefix="holdfast-relay-"))
    figures: dict[str, Any] = {}
    out = scratch / "proxy.out"
    broker = BrokerProcess(["--store", "memory"])
    broker.start()
    try:
        proxy = ProxyProcess(["--upstream", broker.address])
        proxy.command_prefix = columnar._valgrind(out)
        proxy.ready_timeout = 300
        proxy.start()
        try:
            pid = proxy.pid
            assert pid is not None
            meter = loads.CpuMeter({})
            loads.produce(proxy.address, "hf://relay/warm", 2000, SIZE, meter, 600)
            loads.consume(proxy.address, "hf://relay/warm", 2000, SIZE, meter, 600)
            columnar._control(pid, "--zero")
            put = loads.produce(proxy.address, "hf://relay/run", count, SIZE, meter, 1200)
            columnar._control(pid, "--dump")
            figures["put_ack"] = columnar._callgrind_total(out) / count
            # PUTs per client frame: the instructions per message depend on it.
            figures["put_batch"] = put.mean_batch
            columnar._control(pid, "--zero")
            loads.consume(proxy.address, "hf://relay/run", count, SIZE, meter, 1200)
            columnar._control(pid, "--dump")
            figures["push_confirm"] = columnar._callgrind_total(out) / count
        finally:
            harness.stop_server(proxy)
    finally:
        harness.stop_server(broker)
        shutil.rmtree(scratch, ignore_errors=True)
    return figures


def child_cpu(count: int) -> dict[str, Any]:
    """Proxy CPU µs per message, PUT->ACK then PUSH->CONFIRM, one run."""
    import harness
    import loads

    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
    ):
        assert proxy.pid is not None
        meter = loads.CpuMeter({"proxy": proxy.pid})
        loads.produce(proxy.address, "hf://relay/warm", 5000, SIZE, meter)
        loads.consume(proxy.address, "hf://relay/warm", 5000, SIZE, meter)
        put = loads.produce(proxy.address, "hf://relay/run", count, SIZE, meter)
        got = loads.consume(proxy.address, "hf://relay/run", count, SIZE, meter)
    return {
        "put_ack_us": put.cpu_us["proxy"],
        "put_rate": put.rate,
        "push_confirm_us": got.cpu_us["proxy"],
        "push_rate": got.rate,
        "others_cores": put.others_cores,
    }


def _run(links: Path | None, mode: str, count: int) -> dict[str, Any]:
    return columnar.run_in_tree(links, __file__, ["--child", mode, "--count", str(count)], 3600)


def main() -> int:
    """Measure both trees; print one JSON line per measurement."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline-ref", default="main")
    parser.add_argument("--count", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip", choices=("callgrind", "cpu"))
    parser.add_argument("--child", choices=("callgrind", "cpu"))
    args = parser.parse_args()
    if args.child:
        child = {"callgrind": child_callgrind, "cpu": child_cpu}[args.child]
        print(json.dumps(child(args.count)))
        return 0
    with tempfile.TemporaryDirectory(prefix="holdfast-base-") as base:
        links = columnar.baseline_tree(args.baseline_ref, Path(base))
        trees: dict[str, Path | None] = {"before": links, "after": None}
        if args.skip != "callgrind":
            for name, tree in trees.items():
                print(json.dumps({"tree": name, "callgrind": _run(tree, "callgrind", args.count)}))
        if args.skip != "cpu":
            for run in range(args.runs):
                for name, tree in trees.items():
                    result = _run(tree, "cpu", args.count * 4)
                    print(json.dumps({"tree": name, "run": run, "cpu": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

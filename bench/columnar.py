"""Issue #33 before/after: the columnar wire and batch-at-a-time paths against a
baseline tree (``BEFORE`` by default), measured in the same run.

    .venv/bin/python bench/columnar.py [--baseline-ref REF] [--count 100000] [--runs 2]

The baseline is ``git archive``d into a temporary directory and imported instead of
this tree through ``PYTHONPATH`` (a tree of links named ``holdfast``, like
``.typecheck/holdfast``), in child processes whose brokers and proxies inherit it.
Each child measures, for its tree:

- PUT->ACK msg/s of 100-B messages, SDK->broker and SDK->proxy->broker (memory store),
  with the threaded ``Session`` and with the asyncio one;
- SDK bytes per buffered 100-B PUT (``bench/memory.py``), broker bytes per queued
  100-B message (``bench/scale.py``);
- instructions per message of each hop (``valgrind --tool=callgrind``): the hop runs
  under callgrind, its counters are zeroed after a warm-up and dumped after ``count``
  messages, so start-up is not counted; instruction counts do not swing with the
  load of a shared host the way rates do.

NATS JetStream ``publish_async`` with ``Nats-Msg-Id`` (memory storage) is measured
once, against a ``nats-server -js`` this script starts on a free port (stopped by PID).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGES = ("proto", "server", "sdk", "broker", "proxy", "admin", "pool")
SIZE = 100
RATE_KEYS = ("direct", "proxy", "direct_aio", "proxy_aio", "proxy_many")
"""PUT->ACK rates measured per tree: the threaded ``Session`` and the asyncio one
(``holdfast.sdk.aio``, the like of nats.py's asyncio ``publish_async``), each direct
and through the proxy; and a bulk producer through the proxy (``post_many``, 1,000
messages a call; not in the baseline tree)."""
BEFORE = "cbd02c8"
"""The last landed tree before the columnar wire (protocol 1, a message at a time): the
"before" of issue #33's before/after."""


def baseline_tree(ref: str, into: Path) -> Path:
    """Extract ``ref`` into ``into``; the directory to put on ``PYTHONPATH``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    links = into / ".links" / "holdfast"
    links.mkdir(parents=True)
    for name in PACKAGES:
        (links / name).symlink_to(into / name)
    return into / ".links"


def _child_env(links: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(links)] if links is not None else []
    paths += [str(HERE), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_in_tree(
    links: Path | None, script: str, args: list[str], timeout: float = 1800
) -> dict[str, Any]:
    """Run ``python SCRIPT ARGS`` importing the tree at ``links`` (None: this one); the
    JSON of its last line of output, or ``{"error": ...}`` if it failed."""
    proc = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        env=_child_env(links),
        timeout=timeout,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"{args} failed ({proc.returncode}): {proc.stderr[-2000:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_child(links: Path | None, mode: str, count: int, runs: int) -> dict[str, Any]:
    """Run one measurement in a child importing the tree at ``links`` (None: this one)."""
    return run_in_tree(
        links, __file__, ["--child", mode, "--count", str(count), "--runs", str(runs)]
    )


# -- children -------------------------------------------------------------------------


def child_rates(count: int, runs: int) -> dict[str, Any]:
    """PUT->ACK msg/s direct and through the proxy, ``runs`` rounds alternating."""
    import harness
    import loads

    import holdfast.proto
    from holdfast.sdk import Queue

    rates: dict[str, list[float]] = {key: [] for key in RATE_KEYS}
    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
    ):
        for run in range(runs):
            for key, address, produce in (
                ("direct", broker.address, loads.produce),
                ("proxy", proxy.address, loads.produce),
                ("direct_aio", broker.address, loads.produce_async),
                ("proxy_aio", proxy.address, loads.produce_async),
            ):
                result = produce(address, f"hf://col/{key}{run}", count, SIZE, loads.CpuMeter({}))
                rates[key].append(result.rate)
            if hasattr(Queue, "post_many"):  # not in the baseline tree
                meter = loads.CpuMeter({})
                many = loads.produce(
                    proxy.address, f"hf://col/many{run}", count, SIZE, meter, 120, 1000
                )
                rates["proxy_many"].append(many.rate)
    return {"protocol": holdfast.proto.PROTOCOL_VERSION, **rates}


def child_memory(count: int, runs: int) -> dict[str, Any]:
    """SDK bytes per buffered PUT and broker bytes per queued message."""
    import memory
    import scale

    sdk = memory.measure_in_subprocess(count, SIZE)
    depth = scale.depth_and_memory(count, 2000)
    return {"sdk_bytes_per_put": sdk["bytes_per_put"], "broker_bytes": depth["bytes_per_message"]}


def _callgrind_total(out: Path) -> int:
    """The instructions of the dump ``callgrind_control --dump`` asked for (``out.N``,
    the highest N; ``out`` itself is what is left at exit, after the measured part)."""
    dumps = sorted(
        (p for p in out.parent.glob(out.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: int(p.suffix[1:]),
    )
    if not dumps:
        names = sorted(p.name for p in out.parent.iterdir())
        raise RuntimeError(f"no callgrind dump beside {out}: {names}")
    for line in dumps[-1].read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dumps[-1]}")


def _control(pid: int, flag: str) -> None:
    subprocess.run(["callgrind_control", flag, str(pid)], capture_output=True, check=True)


def _valgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--quiet"]


def child_callgrind(count: int, runs: int) -> dict[str, Any]:
    """Instructions per 100-B PUT->ACK message in the broker, the proxy and the SDK
    process, each hop under callgrind in turn (the others at full speed)."""
    import harness
    import loads

    from tests.support.processes import BrokerProcess, ProxyProcess

    figures: dict[str, Any] = {}
    scratch = Path(tempfile.mkdtemp(prefix="holdfast-callgrind-"))
    try:
        for hop in ("broker", "proxy", "sdk"):
            out = scratch / f"{hop}.out"
            broker = BrokerProcess(["--store", "memory"])
            proxy: ProxyProcess | None = None
            if hop == "broker":
                broker.command_prefix = _valgrind(out)
                broker.ready_timeout = 300
            broker.start()
            try:
                address = broker.address
                if hop == "proxy":
                    proxy = ProxyProcess(["--upstream", broker.address])
                    proxy.command_prefix = _valgrind(out)
                    proxy.ready_timeout = 300
                    proxy.start()
                    address = proxy.address
                if hop == "sdk":
                    figures[hop] = _sdk_under_callgrind(address, out, count)
                    continue
                pid = (proxy or broker).pid
                assert pid is not None
                loads.produce(address, "hf://col/warm", 2000, SIZE, loads.CpuMeter({}), 600)
                _control(pid, "--zero")
                loads.produce(address, "hf://col/run", count, SIZE, loads.CpuMeter({}), 1200)
                _control(pid, "--dump")
                figures[hop] = _callgrind_total(out) / count
            finally:
                if proxy is not None:
                    harness.stop_server(proxy)
                harness.stop_server(broker)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return figures


SDK_SCRIPT = """
import subprocess, os, sys
import loads
address, count = sys.argv[1], int(sys.argv[2])
loads.produce(address, "hf://col/warm-sdk", 2000, 100, loads.CpuMeter({}), 600)
subprocess.run(["callgrind_control", "--zero", str(os.getpid())], check=True, capture_output=True)
loads.produce(address, "hf://col/run-sdk", count, 100, loads.CpuMeter({}), 1200)
subprocess.run(["callgrind_control", "--dump", str(os.getpid())], check=True, capture_output=True)
"""


def _sdk_under_callgrind(address: str, out: Path, count: int) -> float:
    command = [*_valgrind(out), sys.executable, "-c", SDK_SCRIPT, address, str(count)]
    subprocess.run(command, check=True, timeout=1800, capture_output=True)
    return _callgrind_total(out) / count


# -- NATS -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def jetstream_rate(count: int, runs: int) -> dict[str, Any]:
    """JetStream publish_async with dedup ids, memory storage, on a server started here."""
    import natsload

    server = shutil.which("nats-server")
    if server is None:
        return {"error": "nats-server is not installed"}
    port = _free_port()
    store = tempfile.mkdtemp(prefix="holdfast-nats-")
    proc = subprocess.Popen(
        [server, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while not natsload.reachable(port=port):
            if time.monotonic() > deadline:
                return {"error": "nats-server did not listen within 15 s"}
            time.sleep(0.05)
        natsload.NATS_PORT = port
        rates = [natsload.publish(count, SIZE, "memory").rate for _ in range(runs)]
        return {"rates": rates}
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(store, ignore_errors=True)


# -- the report -----------------------------------------------------------------------


def _best(values: list[float]) -> float:
    return max(values) if values else float("nan")


def report(base: dict[str, Any], now: dict[str, Any], nats: dict[str, Any]) -> list[str]:
    """The before/after table, with the issue's targets."""
    lines = ["", "Issue #33: columnar frames and batch-at-a-time (same run, same machine)"]
    js = _best(nats.get("rates", []))
    lines.append(f"  JetStream publish_async + Nats-Msg-Id, memory: best {js:,.0f} msg/s")

    def rounds(values: list[float]) -> str:
        return ", ".join(f"{v:,.0f}" for v in values)

    lines.append("  rounds (before / after / JetStream, alternating):")
    for key in RATE_KEYS:
        before, after = base["rates"].get(key, []), now["rates"].get(key, [])
        lines.append(f"    {key:10} before {rounds(before)} | after {rounds(after)}")
    lines.append(f"    JetStream {rounds(nats.get('rates', []))}")
    header = f"  {'figure':44} {'before':>12} {'after':>12} {'target':>12}"
    lines += [header, "  " + "-" * (len(header) - 2)]

    def row(name: str, before: float, after: float, target: str) -> None:
        lines.append(f"  {name:44} {before:12,.1f} {after:12,.1f} {target:>12}")

    for key, label, ratio_target in (
        ("proxy", "sidecar PUT->ACK msg/s (SDK->proxy->broker)", 4.0),
        ("direct", "direct PUT->ACK msg/s (SDK->broker)", 6.0),
        ("proxy_aio", "sidecar, asyncio SDK", 4.0),
        ("direct_aio", "direct, asyncio SDK", 6.0),
        ("proxy_many", "sidecar, post_many (1,000 a call)", 4.0),
    ):
        b, a = _best(base["rates"].get(key, [])), _best(now["rates"].get(key, []))
        row(label, b, a, "")
        row(f"  x JetStream ({key})", b / js, a / js, f">= {ratio_target:.0f}x")
    row(
        "SDK bytes per buffered 100-B PUT",
        base["memory"].get("sdk_bytes_per_put", float("nan")),
        now["memory"].get("sdk_bytes_per_put", float("nan")),
        "<= 200",
    )
    row(
        "broker bytes per queued 100-B message",
        base["memory"].get("broker_bytes", float("nan")),
        now["memory"].get("broker_bytes", float("nan")),
        "<= 200",
    )
    for hop in ("sdk", "proxy", "broker"):
        row(
            f"instructions per PUT->ACK message: {hop}",
            base["callgrind"].get(hop, float("nan")),
            now["callgrind"].get(hop, float("nan")),
            "",
        )
    if now["memory"]:
        lines += [
            "  bytes: RSS growth of the process over 200k messages, so the ~10 MB a broker",
            "  keeps from the fill's frames in flight adds ~50 B a message; the main table",
            "  measures the broker over 1M (bench/PROFILE.md, 'A faster host').",
        ]
    for name, result in (("before", base), ("after", now)):
        for part, value in result.items():
            if isinstance(value, dict) and "error" in value:
                lines.append(f"  {name} {part}: {value['error']}")
    return lines


def _merge_rates(into: dict[str, Any], rates: dict[str, Any]) -> None:
    if "error" in rates:
        into.setdefault("errors", []).append(rates["error"])
        return
    into["protocol"] = rates["protocol"]
    for key in RATE_KEYS:
        into.setdefault(key, []).extend(rates.get(key, []))


def measure(
    trees: dict[str, Path | None], count: int, runs: int, callgrind_count: int, slow: bool
) -> dict[str, Any]:
    """Rates in rounds that alternate before, after and JetStream (a shared host's load
    swings by the minute: side by side, each round sees about the same), then each
    tree's memory and instruction figures (``slow``)."""
    figures: dict[str, dict[str, Any]] = {name: {"rates": {}} for name in trees}
    nats: dict[str, Any] = {"rates": []}
    for round_ in range(runs):
        for name, links in trees.items():
            rates = run_child(links, "rates", count, 1)
            _merge_rates(figures[name]["rates"], rates)
            print(f"columnar {name} round {round_ + 1}: {json.dumps(rates)}", file=sys.stderr)
        js = jetstream_rate(count, 1)
        nats["rates"] += js.get("rates", [])
        if "error" in js:
            nats["error"] = js["error"]
        print(f"columnar JetStream round {round_ + 1}: {json.dumps(js)}", file=sys.stderr)
    for name, links in trees.items():
        for mode, n in (("memory", 200_000), ("callgrind", callgrind_count)):
            figures[name][mode] = run_child(links, mode, n, 1) if slow else {}
            print(f"columnar {name} {mode}: {json.dumps(figures[name][mode])}", file=sys.stderr)
    return {"before": figures["before"], "after": figures["after"], "nats": nats}


def main() -> int:
    """Measure the baseline and this tree; print the table and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-ref", default=BEFORE)
    parser.add_argument(
        "--after-ref", default=None, help="measure this commit instead of the working tree"
    )
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--callgrind-count", type=int, default=5_000)
    parser.add_argument("--child", choices=("rates", "memory", "callgrind"))
    parser.add_argument(
        "--rates-only", action="store_true", help="no memory or instruction figures"
    )
    args = parser.parse_args()
    if args.child is not None:
        child = {"rates": child_rates, "memory": child_memory, "callgrind": child_callgrind}
        print(json.dumps(child[args.child](args.count, args.runs)), flush=True)
        return 0
    results = run_all(
        args.baseline_ref,
        args.after_ref,
        args.count,
        args.runs,
        args.callgrind_count,
        slow=not args.rates_only,
    )
    print("\n".join(results["lines"]))
    print(json.dumps({k: v for k, v in results.items() if k != "lines"}))
    return 0


def run_all(
    ref: str,
    after_ref: str | None,
    count: int,
    runs: int,
    callgrind_count: int,
    slow: bool = True,
) -> dict[str, Any]:
    """Before (``ref``) and after (``after_ref``, or this working tree), and JetStream;
    ``lines`` is the table."""
    with (
        tempfile.TemporaryDirectory(prefix="holdfast-baseline-") as before_dir,
        tempfile.TemporaryDirectory(prefix="holdfast-after-") as after_dir,
    ):
        trees = {
            "before": baseline_tree(ref, Path(before_dir)),
            "after": None if after_ref is None else baseline_tree(after_ref, Path(after_dir)),
        }
        figures = measure(trees, count, runs, callgrind_count, slow)
    return {
        "baseline": ref,
        **figures,
        "lines": report(figures["before"], figures["after"], figures["nats"]),
    }


if __name__ == "__main__":
    sys.exit(main())

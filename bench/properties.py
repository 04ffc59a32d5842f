"""Messages with properties against the same messages without, for ``make bench``.

    .venv/bin/python bench/properties.py [--count 100000] [--rounds 3]

Most messages a service sends carry a few properties (a request/reply request has its
reply queue, its pickup deadline and its kind; a traced one a W3C ``traceparent``), and
each hop reads, checks, digests and writes them per message. This measures what four
such properties cost: one producer posting 100-B messages (``loads.produce``) and one
consumer draining them (``loads.consume``), with ``PROPERTIES`` and without, direct and
through the proxy, memory store, ``rounds`` alternating rounds of each shape; medians,
the ratio with/without, and the CPU microseconds per message of each process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import harness
import loads

PROPERTIES = {
    "reply-to": "hf://bench/replies-7f3a9c2e5d",
    "expires": "1764312345678",
    "kind": "request",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
}
"""Four properties of the shape of a traced request/reply request (names of our own: the
``x-rpc-`` ones are reserved for request/reply)."""

SIZE = 100
HOPS = ("client", "proxy", "broker")
SHAPES = {"none": None, "4 properties": PROPERTIES}


def measure(count: int, rounds: int = 3) -> list[dict[str, Any]]:
    """One row per path and shape: the medians of ``rounds`` produce/consume rounds."""
    rows: list[dict[str, Any]] = []
    with (
        harness.running_broker(harness.memory_store()) as broker,
        harness.running_proxy(broker.address) as proxy,
    ):
        paths = {
            "SDK->broker": (broker.address, {"broker": broker.pid}),
            "SDK->proxy->broker": (proxy.address, {"proxy": proxy.pid, "broker": broker.pid}),
        }
        for path, (address, pids) in paths.items():
            runs: dict[str, list[tuple[loads.ProduceResult, loads.ConsumeResult]]] = {
                shape: [] for shape in SHAPES
            }
            for n in range(rounds):
                for shape, properties in SHAPES.items():
                    uri = f"hf://bench/properties-{len(rows)}-{n}-{len(runs[shape])}"
                    cpu = loads.CpuMeter(pids)
                    produced = loads.produce(address, uri, count, SIZE, cpu, properties=properties)
                    consumed = loads.consume(address, uri, count, SIZE, loads.CpuMeter(pids))
                    runs[shape].append((produced, consumed))
            for shape, done in runs.items():
                rows.append(
                    {
                        "path": path,
                        "shape": shape,
                        "count": count,
                        "put_rate": harness.median([p.rate for p, _ in done]),
                        "push_rate": harness.median([c.rate for _, c in done]),
                        "put_cpu_us": _median_cpu([p.cpu_us for p, _ in done]),
                        "push_cpu_us": _median_cpu([c.cpu_us for _, c in done]),
                        "not_success": sum(p.not_success for p, _ in done),
                        "runs": [
                            {"produce": dataclasses.asdict(p), "consume": dataclasses.asdict(c)}
                            for p, c in done
                        ],
                    }
                )
    return rows


def _median_cpu(runs: list[dict[str, float]]) -> dict[str, float]:
    return {hop: harness.median([run[hop] for run in runs]) for hop in runs[0]}


def describe(rows: list[dict[str, Any]]) -> list[str]:
    """The table's lines."""
    lines = [
        "",
        f"Properties: {SIZE}-B messages with the four properties of a traced request against",
        "none, memory store (medians; CPU us a message: client / proxy / broker)",
        f"  {'path':20} {'shape':13} {'PUT->ACK':>10} {'CPU':>17} "
        f"{'PUSH->CONFIRM':>14} {'CPU':>17}",
    ]
    plain = {row["path"]: row for row in rows if row["shape"] == "none"}
    for row in rows:
        lines.append(
            f"  {row['path']:20} {row['shape']:13} {harness.rate(row['put_rate']):>9}/s "
            f"{_cpu(row['put_cpu_us']):>17} {harness.rate(row['push_rate']):>13}/s "
            f"{_cpu(row['push_cpu_us']):>17}"
        )
    for path, base in plain.items():
        for row in rows:
            if row["path"] == path and row is not base:
                lines.append(
                    f"  {path}: with {row['shape']}, PUT->ACK at "
                    f"{row['put_rate'] / base['put_rate']:.2f}x and PUSH->CONFIRM at "
                    f"{row['push_rate'] / base['push_rate']:.2f}x the rate without"
                )
    return lines


def _cpu(used: dict[str, float]) -> str:
    return " / ".join(f"{used[hop]:.1f}" if hop in used else "-" for hop in HOPS)


def main() -> None:
    """Measure and print the table and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = measure(args.count, args.rounds)
    print("\n".join(describe(rows)))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

"""The examples run as users run them, and say what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.waiting import wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(
    name: str, *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> str:
    """Run ``examples/NAME`` with this interpreter (``env`` added to the environment);
    return its stdout, fail on non-zero exit."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.timeout(180)
def test_outage_demo_keeps_every_message_exactly_once() -> None:
    out = run_example("outage_demo.py", "--count", "20000")
    assert "RESULT: every message exactly once in the queue" in out
    assert "duplicates in the queue (a GUID first-delivered twice): 0" in out
    assert "consumed:    20000 distinct, 0 missing" in out


@pytest.mark.timeout(120)
def test_producer_then_consumer_through_the_proxy(broker: BrokerProcess) -> None:
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        produced = run_example(
            "producer.py",
            "--address",
            proxy.address,
            "--queue",
            "hf://ex/orders",
            "--count",
            "5000",
        )
        assert "posted=5000 acked=5000 by_status={'SUCCESS': 5000}" in produced
        consumed = run_example(
            "consumer.py", "--address", proxy.address, "--queue", "hf://ex/orders", "--idle", "1"
        )
    assert "deliveries=5000 distinct=5000 redeliveries=0" in consumed


@pytest.mark.timeout(120)
def test_rpc_worker_and_caller_through_the_proxy(broker: BrokerProcess) -> None:
    """The README's request/reply example: a worker process, a caller process."""
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        worker = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "rpc_worker.py"), "--address", proxy.address],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "serving hf://demo/quotes"
            out = run_example("rpc_caller.py", "--address", proxy.address)
        finally:
            worker.terminate()  # by PID: SIGTERM, a graceful stop
            assert worker.wait(30) == 0
    assert "has workers: True" in out
    assert "widget x3: {'total': 7.5} {'currency': 'EUR'}" in out
    assert "gadget x1..x10: [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]" in out
    assert "gizmo: ValueError: unknown item 'gizmo'" in out
    assert "unserved: dead-lettered, reason expired" in out


@pytest.mark.timeout(120)
def test_pool_worker_and_caller(broker: BrokerProcess, tmp_path: Path) -> None:
    """The README's keyed worker pool: holdfast-pool starting pool_worker.py per key."""
    log = tmp_path / "pool.log"
    with log.open("wb") as sink:
        manager = subprocess.Popen(
            [
                sys.executable, "-m", "holdfast.pool", "--address", broker.address,
                "--pool", "hf://infra/sim",
                "--worker-command", f"{sys.executable} {EXAMPLES / 'pool_worker.py'}",
            ],
            stderr=sink,
        )  # fmt: skip
    try:
        wait_until(lambda: b"managing pool" in log.read_bytes(), 30, "the pool manager")
        out = run_example("pool_caller.py", "--address", broker.address)
    finally:
        manager.terminate()  # by PID; it stops the workers it started
        assert manager.wait(60) == 0
    assert out.splitlines() == [
        "simulated a train for 42",
        "simulated a train for 43",
        "simulated a train for 42",
    ]


@pytest.mark.timeout(120)
def test_asyncio_producer_and_consumer_through_the_proxy(broker: BrokerProcess) -> None:
    """The README's asyncio example: ``await queue.post`` and ``async for``."""
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        out = run_example("aio_producer_consumer.py", "--address", proxy.address, "--count", "2000")
    assert "posted=2000 acked=2000 by_status={'SUCCESS': 2000}" in out
    assert "consumed=2000 distinct=2000" in out


@pytest.mark.timeout(120)
def test_rpc_streams_example_uploads_and_gets_a_stream_back(broker: BrokerProcess) -> None:
    """The README's data-stream block: 8 MiB up, its digest and a report stream back."""
    out = run_example("rpc_streams.py", env={"HOLDFAST_ADDRESS": broker.address})
    assert "report: checked by the example worker" in out
    assert "digest matches: True" in out


@pytest.mark.timeout(120)
def test_aio_rpc_streams_example_uploads_and_gets_a_stream_back(broker: BrokerProcess) -> None:
    """The README's asyncio data-stream block: 8 MiB up with ``async for`` on the
    worker, its digest and a report streamed back from an async generator."""
    out = run_example("aio_rpc_streams.py", env={"HOLDFAST_ADDRESS": broker.address})
    assert "report: checked by the asyncio example worker" in out
    assert "digest matches: True" in out

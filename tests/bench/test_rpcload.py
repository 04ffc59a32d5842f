"""Smoke test of the request/reply bench (``bench/rpcload.py``, part of ``make bench``):
it runs end to end with a few calls and prints every row, the baseline first, and the
table states the same-run ratio against that baseline. No speed is asserted here:
figures belong to ``make bench``."""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, *args: str, stdin: str = "", timeout: float = 150) -> str:
    """Run ``python bench/SCRIPT ARGS`` (or ``-c SCRIPT``) in ``bench/``, in a process
    group of its own; if it overruns, the group is stopped by its id (the script's PID):
    SIGTERM, then SIGKILL, so the servers and workers it started go with it even when
    it cannot unwind (a SIGTERM that lands in a C call left its workers running)."""
    command = [sys.executable, "-c", script] if script.startswith("import") else [
        sys.executable, str(BENCH / script)
    ]  # fmt: skip
    proc = subprocess.Popen(
        [*command, *args],
        cwd=BENCH,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
        proc.wait(5)
        raise
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{out}\n{err[-3000:]}"
    return out


@pytest.mark.timeout(240)
def test_rpc_bench_runs_every_row_and_states_the_ratio_to_its_baseline() -> None:
    out = run_bench("rpcload.py", "--count", "400", "--window", "32")
    rows: list[dict[str, Any]] = [ast.literal_eval(line) for line in out.splitlines()]
    names = [row["name"] for row in rows]
    # The baseline is measured first, in the same run: the tree as #35 was filed, then
    # this tree in the same shape.
    assert "old shape" in names[0] and names[0].endswith("tree ea953de"), names[0]
    assert "old shape" in names[1] and names[1].endswith("this tree"), names[1]
    assert {row["workers"] for row in rows[2:4]} == {4}
    assert any(name.startswith("request/reply asyncio, SDK->proxy") for name in names)
    assert names[-1].startswith("plain gRPC unary")
    for row in rows:
        assert row["rate"] > 0 and row["sequential_rate"] > 0, row
        assert 0 < row["p50"] <= row["p99"], row
        assert row["sequential"] > 0, row
    printed = run_bench(
        "import ast, sys, report; report.print_rpc([ast.literal_eval(l) for l in sys.stdin])",
        stdin=out,
    )
    assert "now/baseline = " in printed
    assert "same run: tree ea953de" in printed
    assert "1 worker process of 8 threads, 32 in flight" in printed
    assert "one call at a time" in printed

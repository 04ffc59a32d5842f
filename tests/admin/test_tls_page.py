"""docs/tls.md ("From zero to mTLS") runs as written: its shell commands and its Python
block, with only the folder and the ports changed (``certs/`` becomes a temporary
folder, the fixed ports free ones)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import BrokerProcess, ProxyProcess

pytestmark = pytest.mark.timeout(90)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tls.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), re.S)


def commands() -> dict[str, list[str]]:
    """Each shell command of the page by program name, continuation lines joined."""
    found: dict[str, list[str]] = {}
    for block in blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.rstrip().removesuffix("&"))
            if words:
                found.setdefault(words[0], words[1:])
    return found


def without(args: list[str], option: str) -> list[str]:
    """``args`` less ``option`` and its value."""
    at = args.index(option)
    return args[:at] + args[at + 2 :]


def test_the_page_runs_as_written(tmp_path: Path) -> None:
    folder = f"{tmp_path}/certs/"

    def here(args: list[str]) -> list[str]:
        return [arg.replace("certs/", folder).replace("holdfast.db", f"{tmp_path}/hf.db")
                for arg in args]  # fmt: skip

    steps = commands()
    assert {"pip", "holdfast", "holdfast-broker", "holdfast-proxy"} <= steps.keys()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
    holdfast = [sys.executable, "-m", "holdfast.admin"]
    made = subprocess.run(
        [*holdfast, *here(steps["holdfast"])], capture_output=True, text=True, timeout=30
    )
    assert made.returncode == 0, made.stderr
    broker_args = here(without(steps["holdfast-broker"], "--listen"))
    with BrokerProcess(broker_args) as broker:
        proxy_args = without(here(without(steps["holdfast-proxy"], "--listen")), "--upstream")
        with ProxyProcess([*proxy_args, "--upstream", broker.address]) as proxy:
            (program,) = blocks("python")
            program = program.replace("certs/", folder).replace("127.0.0.1:7701", proxy.address)
            ran = subprocess.run(
                [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
            )
            assert ran.returncode == 0, ran.stderr
        # The admin step is the last `holdfast` command of the page.
        admin = [b for b in blocks("sh") if b.startswith("holdfast queues")]
        (line,) = admin
        args = here(shlex.split(line.replace("\\\n", " ")))[1:]
        args[args.index("--address") + 1] = broker.address
        listed = subprocess.run(
            [*holdfast, *args], capture_output=True, text=True, timeout=30, env=env
        )
        assert listed.returncode == 0, listed.stderr
        assert "hf://demo/orders" in listed.stdout

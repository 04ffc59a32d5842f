"""Every Python block of the README is code that runs: the block's lines stand, in
order, in an example the tests run (examples/), so the README cannot drift from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.examples.test_examples import EXAMPLES, run_example
from tests.support.processes import BrokerProcess, ProxyProcess

README = Path(__file__).resolve().parents[2] / "README.md"


def normalized(text: str) -> list[str]:
    """Lines without indentation and blank lines: an excerpt from inside a function
    matches the same lines at the top level of a README block."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def contains(haystack: list[str], needle: list[str]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack)))


def test_every_readme_python_block_is_in_an_example() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 6
    examples = {path.name: normalized(path.read_text()) for path in EXAMPLES.glob("*.py")}
    for block in blocks:
        lines = normalized(block)
        homes = [name for name, text in examples.items() if contains(text, lines)]
        assert homes, f"this README block is in no example:\n{block}"


@pytest.mark.timeout(120)
def test_the_quickstart_runs_as_the_readme_says(broker: BrokerProcess) -> None:
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        env = {"HOLDFAST_ADDRESS": proxy.address}
        assert "posted 1000, ACKed SUCCESS 1000" in run_example("quickstart_producer.py", env=env)
        assert "consumed 1000 distinct messages" in run_example("quickstart_consumer.py", env=env)
        assert "posted 100, received 100" in run_example("aio_quickstart.py", env=env)
    assert "refused 1, delivered 1" in run_example("testing_quickstart.py")

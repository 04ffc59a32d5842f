"""Scraping a server's Prometheus endpoint (``--metrics-port 0``) in tests."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import ServerProcess
from tests.support.waiting import wait_until

_METRICS_LINE = re.compile(r"metrics on (\S+:\d+)")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Sample values by (sample name, sorted label pairs)."""


def metrics_address(process: ServerProcess, timeout: float = 10.0) -> str:
    """``HOST:PORT`` of the metrics endpoint the server logged most recently."""
    wait_until(lambda: _METRICS_LINE.search(process.output), timeout, "the 'metrics on' line")
    addresses: list[str] = _METRICS_LINE.findall(process.output)
    return addresses[-1]


def scrape(address: str, timeout: float = 5.0) -> Samples:
    """Every sample ``http://ADDRESS/metrics`` serves now."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with exactly ``labels``, or None if absent."""
    return samples.get((name, tuple(sorted(labels.items()))))

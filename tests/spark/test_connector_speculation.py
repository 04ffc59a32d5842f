"""A speculative copy of a slow task, through ``format("holdfast")``, adds nothing.

Spark launches a second attempt of a task that runs slow while the first still runs,
on another host; both stage rows with the broker, and only the attempt Spark's
OutputCommitCoordinator lets commit may become visible. Spark never places the copy on
the host of the original, so this needs a standalone cluster of two Workers on two
addresses (``cluster.StandaloneCluster``), driven by ``speculation_driver.py`` in a
subprocess (this process holds a local SparkSession already).

One driver run makes the four writes of ``WRITES`` in turn (JVM starts dominate the
time): ``keyColumn`` or content keys, straight to the broker or through the proxy. In
each, partition ``SLOW``'s first attempt stalls after ``AFTER`` rows until the write
has returned; its copy starts its rows only once the broker holds rows the original
staged (``faults.Straggler``). The test then requires from Spark's own record that a
speculative attempt of that partition ran on the other host and succeeded (no copy is
a failure, never a pass), from the broker that the commit published every row and
discarded the original's, and from the queue every row exactly once.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.spark.cluster import StandaloneCluster
from tests.spark.drivers import DriverProcess
from tests.support.metrics import metrics_address, scrape, value
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import drain_messages, unique_uri

pytestmark = pytest.mark.slow

SPECULATION_DRIVER = Path(__file__).with_name("speculation_driver.py")

ROWS, PARTITIONS = 16_000, 4
SLOW, AFTER = 1, 3_500
"""Partition ``SLOW``'s first attempt stalls after ``AFTER`` of its 4,000 rows. Rows
carry a 1 KB ``note`` (``NOTE``), so the buffers between the Python workers and the
JVM hold a few hundred rows only, and the writer has sent the broker some of its
1 MiB chunks (about 1,000 rows each) when the stall begins."""

NOTE = "repeat('x', 1000)"

STALL = 30.0
"""Most seconds the original attempt stalls (and the copy waits for its staged rows).
Spark launches the copy within seconds and kills the original once the copy
succeeded; without a copy the write ends after this stall and its test fails for want
of one."""

DRIVER_TIMEOUT = 240.0
"""Seconds the driver may take for its session, its writes, and stopping."""


WRITES = [
    ("key-column-direct", "order_id", False),
    ("key-column-proxy", "order_id", True),
    ("content-keys-direct", "", False),
    ("content-keys-proxy", "", True),
]
"""The driver's writes, in order: label, ``keyColumn`` ("": content keys), through
the proxy or not."""


@dataclass
class Write:
    """One write the driver makes: where it goes and how its rows are keyed."""

    label: str
    uri: str
    address: str
    key_column: str


@dataclass
class Outcome:
    """What the driver run left: the broker the writes went to, its tasks per write
    (Spark's status store, via the driver), and the marker directory."""

    broker: BrokerProcess
    writes: dict[str, Write]
    tasks: dict[str, list[dict[str, Any]]]
    markers: Path


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    """Start a broker, a proxy and a two-Worker cluster; run the driver's writes; stop
    everything but the broker (the tests drain it)."""
    work = tmp_path_factory.mktemp("speculation")
    markers = work / "markers"
    broker = BrokerProcess(["--metrics-port", "0"]).start()
    try:
        with (
            ProxyProcess(["--upstream", broker.address]) as proxy,
            StandaloneCluster(work / "cluster") as cluster,
        ):
            writes = {
                label: Write(
                    label,
                    unique_uri(f"speculation-{label}"),
                    proxy.address if via_proxy else broker.address,
                    key_column,
                )
                for label, key_column, via_proxy in WRITES
            }
            args = [
                *("--master", cluster.master_url, "--markers", str(markers)),
                *("--metrics", metrics_address(broker)),
                *("--writes", json.dumps([vars(w) for w in writes.values()])),
                *("--rows", str(ROWS), "--partitions", str(PARTITIONS), "--note", NOTE),
                *("--slow-partition", str(SLOW), "--after", str(AFTER), "--stall", str(STALL)),
            ]
            with DriverProcess(args, script=SPECULATION_DRIVER) as driver:
                driver.wait_for("done", DRIVER_TIMEOUT)
                tasks = {
                    line.split(" ", 2)[1]: json.loads(line.split(" ", 2)[2])
                    for line in driver.stdout.splitlines()
                    if line.startswith("tasks ")
                }
        yield Outcome(broker, writes, tasks, markers)
    finally:
        broker.close()


@pytest.mark.timeout(360)
@pytest.mark.parametrize("label", [label for label, _, _ in WRITES])
def test_a_speculative_copy_adds_nothing(outcome: Outcome, label: str) -> None:
    """A speculative copy of partition 1 commits; the stalled original's staged rows
    are discarded: the queue holds each of the 16,000 rows once."""
    write, tasks = outcome.writes[label], outcome.tasks[label]
    slow = [t for t in tasks if t["partition"] == SLOW]
    summary = json.dumps(slow, indent=1)
    originals = [t for t in slow if t["attempt"] == 0]
    copies = [t for t in slow if t["speculative"]]
    assert copies, f"Spark launched no speculative copy of partition {SLOW}:\n{summary}"
    assert len(originals) == 1 and not originals[0]["speculative"], summary
    assert originals[0]["status"] != "SUCCESS", f"the stalled original succeeded:\n{summary}"
    assert [t["speculative"] for t in slow if t["status"] == "SUCCESS"] == [True], summary
    assert copies[0]["host"] != originals[0]["host"], summary
    succeeded = Counter(t["partition"] for t in tasks if t["status"] == "SUCCESS")
    assert succeeded == Counter(range(PARTITIONS)), tasks
    # The task code's own account: the original stalled with AFTER rows passed on, and
    # the copy began once the broker held more staged rows than the other partitions'.
    markers = outcome.markers / label
    assert (markers / f"stalled-p{SLOW}-a0").read_text() == str(AFTER)
    seen = int((markers / f"attempt-p{SLOW}-a{copies[0]['attempt']}").read_text())
    assert seen > ROWS - ROWS // PARTITIONS, f"the original had staged nothing ({seen} staged)"
    # The broker's account of the commit: every row published once, and the rows the
    # original had staged discarded.
    commits = outcome.broker.lines_with(f"on {write.uri}: ")
    assert len(commits) == 1, outcome.broker.output[-3000:]
    counts = re.search(r"(\d+) rows published, (\d+) discarded", commits[0])
    assert counts is not None, commits
    published, discarded = map(int, counts.groups())
    assert (published, discarded > 0) == (ROWS, True), (published, discarded)
    # Nothing of any attempt stays staged: the original's late rows were refused.
    assert value(scrape(metrics_address(outcome.broker)), "holdfast_broker_staged_rows") == 0
    messages = drain_messages(outcome.broker.address, write.uri, ROWS)
    ids = Counter(json.loads(m.payload)["order_id"] for m in messages)
    assert ids == Counter(range(ROWS))

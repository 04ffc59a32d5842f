"""The ``holdfast`` command as an operator runs it: a subprocess against a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import Session
from holdfast.sdk.admin import AdminClient
from tests.policies.support import FAST, Collector, post_all
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

URI = "hf://shop/orders"
DLQ = "hf://shop/orders.dlq"


@pytest.fixture(scope="module")
def shared() -> Iterator[BrokerProcess]:
    with BrokerProcess() as broker:
        yield broker


def holdfast(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``holdfast --address ADDRESS ARGS...`` and return what it did."""
    return subprocess.run(
        [sys.executable, "-m", "holdfast.admin", "--address", address, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_queues_stats_peek_and_policy_in_tables_and_json(shared: BrokerProcess) -> None:
    uri = "hf://cli/listed"
    with Session(shared.address, options=FAST) as session:
        post_all(session, uri, [b"hello", b"\xff\x00binary"])
    done = holdfast(shared.address, "queues")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == [
        "URI", "READY", "UNCONFIRMED", "BYTES", "CONSUMERS", "OLDEST_S", "DEAD"
    ]  # fmt: skip
    assert any(line.split()[:3] == [uri, "2", "0"] for line in done.stdout.splitlines())
    listed = json.loads(holdfast(shared.address, "queues", "--json").stdout)
    entry = next(q for q in listed if q["uri"] == uri)
    assert (entry["ready"], entry["unconfirmed"], entry["bytes"]) == (2, 0, 13)
    stats = json.loads(holdfast(shared.address, "stats", uri, "--json").stdout)
    assert (stats["ready"], stats["unconfirmed"], stats["policy"]["ttl_seconds"]) == (2, 0, None)
    peeked = holdfast(shared.address, "peek", uri, "-n", "1")
    assert peeked.returncode == 0 and "hello" in peeked.stdout and "binary" not in peeked.stdout
    messages = json.loads(holdfast(shared.address, "peek", uri, "--json").stdout)
    assert [m.get("payload_text") for m in messages] == ["hello", None]
    assert messages[1]["payload_base64"] == "/wBiaW5hcnk="
    done = holdfast(
        shared.address, "policy", "set", uri, "--max-deliveries", "5", "--dead-letter", DLQ
    )
    assert done.returncode == 0 and "max-deliveries=5" in done.stdout
    # Only the fields given change; 0 clears one.
    holdfast(shared.address, "policy", "set", uri, "--ttl", "30")
    holdfast(shared.address, "policy", "set", uri, "--max-deliveries", "0")
    shown = json.loads(holdfast(shared.address, "policy", "show", uri, "--json").stdout)
    assert shown == {
        "dead_letter": DLQ,
        "max_bytes": None,
        "max_deliveries": None,
        "max_messages": None,
        "redirect": None,
        "ttl_seconds": 30.0,
    }
    assert holdfast(shared.address, "policy", "show", uri).stdout.strip() == (
        f"ttl=30s dead-letter={DLQ}"
    )


def test_purge_delete_and_dlq_replay(shared: BrokerProcess) -> None:
    uri, dlq = "hf://cli/work", "hf://cli/work.dlq"
    with AdminClient(shared.address) as admin:
        admin.set_policy(uri, QueuePolicy(dead_letter=dlq))
    got = Collector(confirm=False)
    with Session(shared.address, options=FAST) as session:
        post_all(session, uri, [b"a", b"b"])
        handle = session.open_queue(uri, read=True, on_message=got)
        for message in got.wait_for(2):
            message.reject(requeue=False)
        wait_until(lambda: "work.dlq" in holdfast(shared.address, "queues").stdout, 10, "the dlq")
        refused = holdfast(shared.address, "delete", uri)
        assert refused.returncode == 5
        assert refused.stderr.count("\n") == 1 and "open handles" in refused.stderr
        handle.close()
    replayed = holdfast(shared.address, "dlq", "replay", dlq)
    assert (replayed.returncode, replayed.stdout.strip()) == (0, f"replayed 2 messages from {dlq}")
    purged = holdfast(shared.address, "purge", uri)
    assert (purged.returncode, purged.stdout.strip()) == (0, f"purged 2 messages from {uri}")
    deleted = holdfast(shared.address, "delete", uri)
    assert (deleted.returncode, deleted.stdout.strip()) == (0, f"deleted {uri} (0 messages)")


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (("stats", "hf://no/such"), 4, "no queue hf://no/such"),
        (("stats", "orders"), 2, "invalid queue URI 'orders'"),
        (("purge", "hf://bad//uri"), 2, "invalid queue URI"),
        (("peek", URI, "-n", "0"), 2, "-n must be in [1, 1000]"),
        (("policy", "set", URI, "--ttl", "-5"), 2, "argument --ttl: must be in"),
        (("policy", "set", URI, "--dead-letter", "nope"), 2, "invalid queue URI 'nope'"),
        (("dlq", "replay", "hf://no/such"), 4, "no queue"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(
    shared: BrokerProcess, args: tuple[str, ...], code: int, text: str
) -> None:
    done = holdfast(shared.address, *args)
    assert done.returncode == code, done.stderr
    assert text in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_an_unreachable_broker_is_one_clear_line(free_port: int) -> None:
    address = f"127.0.0.1:{free_port}"
    done = holdfast(address, "queues")
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1 and address in done.stderr
    assert "UNAVAILABLE" in done.stderr
    done = holdfast("not-an-address", "queues")
    assert (done.returncode, done.stderr.count("\n")) == (2, 1)
    assert "expected HOST:PORT" in done.stderr


def test_a_proxy_is_not_an_admin_endpoint(shared: BrokerProcess) -> None:
    from tests.support.processes import ProxyProcess

    with ProxyProcess(["--upstream", shared.address]) as proxy:
        done = holdfast(proxy.address, "queues")
    assert done.returncode == 3
    assert "does not serve the admin service" in done.stderr

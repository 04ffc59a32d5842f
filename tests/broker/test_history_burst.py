"""A burst past the broker's GUID history bound (issue #33's tester): every PUT the
broker pushed back with HISTORY_FULL goes in once the history has room, however long
that takes against the dedup window, and each is delivered once; directly and through
the proxy. Before, the retries kept the age of the first post, reached the window,
were refused TOO_OLD and reported UNKNOWN, though never enqueued."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from holdfast.sdk import AckStatus, Message, QueueOptions, Session
from holdfast.sdk.types import Ack
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

BOUND = 200
BURST = 500
WINDOW = 3.0
"""Seconds; the history frees its first entries after the window and the grace (1 s)."""


@pytest.mark.parametrize("path", ["direct", "proxy"])
def test_a_burst_past_the_history_bound_goes_in_whole_and_once(path: str) -> None:
    args = ["--history-max-guids", str(BOUND), "--dedup-window", str(WINDOW)]
    with (
        BrokerProcess([*args, "--dedup-grace", "1"]) as broker,
        ProxyProcess(["--upstream", broker.address]) as proxy,
    ):
        address = broker.address if path == "direct" else proxy.address
        uri = "hf://burst/history"
        lock = threading.Lock()
        acks: dict[object, list[AckStatus]] = {}
        delivered: Counter[bytes] = Counter()

        def on_ack(ack: Ack) -> None:
            with lock:
                acks.setdefault(ack.guid, []).append(ack.status)

        def on_message(message: Message) -> None:
            with lock:
                delivered[message.payload] += 1
            message.confirm()

        with Session(broker.address) as reader, Session(address) as writer:
            reader.open_queue(
                uri,
                read=True,
                on_message=on_message,
                options=QueueOptions(max_unconfirmed_messages=BURST),
            )
            queue = writer.open_queue(uri, write=True, on_ack=on_ack)
            guids = [queue.post(b"m%d" % i) for i in range(BURST)]
            # Three windows at least: the last ones wait for room twice over.
            assert writer.flush(timeout=60), "pushed-back PUTs never went in"
            wait_until(lambda: sum(delivered.values()) >= BURST, 30, "every message")
    assert {guid: acks.get(guid) for guid in guids} == {g: [AckStatus.SUCCESS] for g in guids}
    assert delivered == Counter({b"m%d" % i: 1 for i in range(BURST)})

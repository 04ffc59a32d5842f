"""The broker's side of exactly-once at the edges (issue 11), through real gRPC: ages
past the window, the grace for time in flight, GUIDs known while their message lives,
content conflicts, the history bound, and delivery counts across a kill -9."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from holdfast.proto import pb
from tests.broker.test_dedup import drain
from tests.broker.util import connected, new_guid, options, statuses, unique_uri
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def test_an_unknown_guid_older_than_the_window_is_refused_too_old(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory("--dedup-window", "5")
    uri = unique_uri("too-old")
    fresh, at_limit, old = new_guid(), new_guid(), new_guid()
    with connected(broker.address) as client:
        client.open(1, uri, write=True)
        client.put(1, [(fresh, b"x", {})], age_ms=4_000)
        client.put(1, [(at_limit, b"x", {})], age_ms=5_000)
        client.put(1, [(old, b"x", {})], age_ms=5_001)
        assert statuses(client.acks(3)) == ["STATUS_OK", "STATUS_OK", "STATUS_TOO_OLD"]
        # A known GUID is a replay at any age: the broker can vouch for it.
        client.put(1, [(fresh, b"x", {})], age_ms=60_000)
        assert statuses(client.acks(1)) == ["STATUS_OK"]
        assert drain(client, uri, 2) == Counter({fresh: 1, at_limit: 1})


def test_a_replay_delayed_in_flight_past_the_window_is_still_recognised(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    # Sent just inside the window (age 990 ms) but arriving 1.5 s after the original was
    # accepted: the grace keeps the original's entry, so the replay is not enqueued.
    window = 1.0
    broker = broker_factory("--dedup-window", str(window), "--dedup-grace", "3")
    uri = unique_uri("in-flight")
    guid = new_guid()
    with connected(broker.address) as client:
        client.open(1, uri, write=True)
        accepted = time.monotonic()
        client.put(1, [(guid, b"x", {})])
        assert statuses(client.acks(1)) == ["STATUS_OK"]
        assert drain(client, uri, 1) == Counter({guid: 1})
        wait_until(lambda: time.monotonic() - accepted > window + 0.5, timeout=5)
        client.put(1, [(guid, b"x", {})], age_ms=990)
        assert statuses(client.acks(1)) == ["STATUS_OK"]
        assert client.quiet("pushes", 0.3) == []


@pytest.mark.parametrize("held", ["queued", "unconfirmed"])
def test_a_guid_is_known_while_its_message_lives_whatever_the_window(
    broker_factory: Callable[..., BrokerProcess], held: str
) -> None:
    broker = broker_factory("--dedup-window", "0.3", "--dedup-grace", "0")
    uri = unique_uri(f"live-{held}")
    guid = new_guid()
    with connected(broker.address) as producer, connected(broker.address) as holder:
        producer.open(1, uri, write=True)
        producer.put(1, [(guid, b"x", {})])
        assert statuses(producer.acks(1)) == ["STATUS_OK"]
        if held == "unconfirmed":
            holder.open(1, uri, read=True, options=options(messages=10))
            (push,) = holder.pushes(1)
            assert push.delivery_count == 1
        time.sleep(0.8)  # the history forgot it; the message is still there
        producer.put(1, [(guid, b"x", {})])
        assert statuses(producer.acks(1)) == ["STATUS_OK"]
        producer.put(1, [(guid, b"other", {})])
        assert statuses(producer.acks(1)) == ["STATUS_CONFLICT"]
        if held == "unconfirmed":
            holder.close_queue(1)  # gives the message back, unconfirmed
        with connected(broker.address) as consumer:
            received = drain(consumer, uri, 1)
    assert received == Counter({guid: 1})


def test_a_replay_with_other_content_is_a_conflict_and_the_original_stays(
    shared_broker: BrokerProcess,
) -> None:
    uri = unique_uri("conflict")
    guid, other = new_guid(), new_guid()
    with connected(shared_broker.address) as client:
        client.open(1, uri, write=True)
        client.put(1, [(guid, b"original", {"k": "v"}), (guid, b"original", {"k": "w"})])
        assert statuses(client.acks(2)) == ["STATUS_OK", "STATUS_CONFLICT"]
        client.put(1, [(guid, b"changed", {"k": "v"}), (other, b"o", {})])
        assert statuses(client.acks(2)) == ["STATUS_CONFLICT", "STATUS_OK"]
        client.put(1, [(guid, b"original", {"k": "v"})])
        assert statuses(client.acks(1)) == ["STATUS_OK"]
        assert client.open(99, uri, read=True, options=options(messages=100)).status == (
            pb.STATUS_OK
        )
        pushes = client.pushes(2)
    assert [(p.guid, p.payload, dict(p.properties)) for p in pushes] == [
        (guid, b"original", {"k": "v"}),
        (other, b"o", {}),
    ]


def test_past_the_history_bound_new_puts_get_history_full_and_nothing_is_forgotten(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(
        "--dedup-window", "0.5", "--dedup-grace", "0", "--history-max-guids", "3"
    )
    uri = unique_uri("bound")
    guids = [new_guid() for _ in range(4)]
    with connected(broker.address) as client:
        client.open(1, uri, write=True)
        client.put(1, [(g, b"x", {}) for g in guids])
        assert statuses(client.acks(4)) == ["STATUS_OK"] * 3 + ["STATUS_HISTORY_FULL"]
        client.put(1, [(guids[0], b"x", {})])  # still known: a replay, not refused
        assert statuses(client.acks(1)) == ["STATUS_OK"]
        assert drain(client, uri, 3) == Counter(guids[:3])
        time.sleep(0.8)  # the entries expire: room again
        client.put(1, [(guids[3], b"x", {})])
        assert statuses(client.acks(1)) == ["STATUS_OK"]


@pytest.mark.timeout(90)
def test_redeliveries_after_a_kill_9_count_higher_than_every_earlier_delivery(
    tmp_path: Path,
) -> None:
    count = 3000
    with BrokerProcess(["--store", f"sqlite:{tmp_path / 'b.db'}", "--sync", "full"]) as broker:
        uri = unique_uri("counts")
        guids = [new_guid() for _ in range(count)]
        with connected(broker.address) as producer:
            producer.open(1, uri, write=True)
            for start in range(0, count, 500):
                producer.put(1, [(g, b"x", {}) for g in guids[start : start + 500]])
            assert statuses(producer.acks(count)) == ["STATUS_OK"] * count
        seen: dict[bytes, int] = {}
        with connected(broker.address) as consumer:
            consumer.open(1, uri, read=True, options=options(messages=count))
            # Kill as soon as the first PUSHes arrive: a count not yet durable is lost.
            for push in consumer.pushes(1):
                seen[push.guid] = push.delivery_count
            broker.kill()
        assert seen and set(seen.values()) == {1}
        broker.restart()
        with connected(broker.address) as consumer:
            consumer.open(1, uri, read=True, options=options(messages=count))
            pushes = consumer.pushes(count, timeout=30)
            consumer.confirm(1, [p.guid for p in pushes])
    again = {p.guid: p.delivery_count for p in pushes}
    assert set(again) == set(guids)
    lower = [g for g, c in seen.items() if again[g] <= c]
    assert lower == [], f"{len(lower)} of {len(seen)} redeliveries did not count higher"

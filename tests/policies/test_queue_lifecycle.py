"""Depth limits, purge, delete, and policies that outlive a restart (issue #14)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from holdfast.proto.policy import QueuePolicy
from holdfast.sdk import Ack, AckStatus, QueueOptions, Session, aio
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import (
    BrokerBusyError,
    InvalidArgumentError,
    QueueInUseError,
    QueueNotFoundError,
)
from tests.policies.support import FAST, Collector, post_all
from tests.support.processes import BrokerProcess
from tests.support.waiting import wait_until, wait_until_async

pytestmark = pytest.mark.timeout(60)

URI = "hf://shop/orders"


def test_a_queue_at_its_depth_limit_pushes_back_on_post_and_drops_nothing(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    admin.set_policy(URI, QueuePolicy(max_messages=3))
    acks: dict[uuid.UUID, AckStatus] = {}
    with Session(broker.address, options=FAST) as session:
        queue = session.open_queue(
            URI, write=True, on_ack=lambda a: acks.__setitem__(a.guid, a.status)
        )
        taken = [queue.post(b"m%d" % i) for i in range(4)]
        wait_until(lambda: len(acks) == 3, 10, "three ACKs")
        assert admin.stats(URI).ready == 3  # the fourth is held by the SDK, not dropped
        started = time.monotonic()
        with pytest.raises(BrokerBusyError, match="depth limit"):
            queue.post(b"refused")
        assert time.monotonic() - started >= 4.5  # post() waited before refusing
        started = time.monotonic()
        with pytest.raises(BrokerBusyError, match="depth limit"):
            queue.post_many([b"refused too", b"and this"])
        assert time.monotonic() - started >= 4.5  # so did post_many(), taking none
        assert admin.stats(URI).ready == 3
        # Room again: the held PUT goes in by itself, exactly once.
        got = Collector()
        session.open_queue(URI, read=True, on_message=got)
        assert session.flush(timeout=15)
        got.wait_for(4)
    assert [acks[g] for g in taken] == [AckStatus.SUCCESS] * 4
    assert sorted(m.payload for m in got.messages) == [b"m0", b"m1", b"m2", b"m3"]


def test_the_asyncio_session_waits_on_a_full_queue_too_and_drops_nothing(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    """Rule 7 on the asyncio front-end: ``await post()`` and ``await post_many()`` on a
    queue the broker pushes back on wait (the loop runs on), then raise
    ``BrokerBusyError`` without taking anything; the held PUT goes in once there is
    room."""
    admin.set_policy(URI, QueuePolicy(max_messages=2))
    acks: dict[uuid.UUID, AckStatus] = {}

    async def main() -> None:
        async with aio.Session(broker.address, options=FAST) as session:
            queue = await session.open_queue(
                URI, write=True, on_ack=lambda a: acks.__setitem__(a.guid, a.status)
            )
            taken = [await queue.post(b"m%d" % i) for i in range(3)]
            await wait_until_async(lambda: len(acks) == 2, 10, "two ACKs")
            ticks = 0

            async def tick() -> None:  # the loop keeps running while post() waits
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.1)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            started = time.monotonic()
            with pytest.raises(BrokerBusyError, match="depth limit"):
                await queue.post(b"refused")
            with pytest.raises(BrokerBusyError, match="depth limit"):
                await queue.post_many([b"refused too", b"and this"])
            assert time.monotonic() - started >= 9.0  # each waited ~5 s before refusing
            ticker.cancel()
            assert ticks >= 40
            assert admin.stats(URI).ready == 2  # nothing refused was taken
            admin.purge(URI)
            assert await session.flush(15)  # room again: the held PUT goes in, once
            assert [acks[g] for g in taken] == [AckStatus.SUCCESS] * 3
        assert admin.stats(URI).ready == 1

    asyncio.run(main())


def test_a_byte_limit_counts_payload_bytes(broker: BrokerProcess, admin: AdminClient) -> None:
    admin.set_policy(URI, QueuePolicy(max_bytes=250))
    acks: list[Ack] = []
    with Session(broker.address, options=FAST) as session:
        queue = session.open_queue(URI, write=True, on_ack=acks.append)
        for _ in range(3):
            queue.post(b"x" * 100)
        wait_until(lambda: len(acks) == 2, 10, "two ACKs")
        assert admin.stats(URI).bytes == 200
        admin.purge(URI)
        assert session.flush(timeout=15)
    assert [a.status for a in acks] == [AckStatus.SUCCESS] * 3


def test_purge_with_a_consumer_attached_keeps_what_it_holds(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    got = Collector(confirm=False)
    with Session(broker.address, options=FAST) as session:
        post_all(session, URI, [b"m%d" % i for i in range(10)])
        session.open_queue(
            URI, read=True, on_message=got, options=QueueOptions(max_unconfirmed_messages=2)
        )
        held = got.wait_for(2)
        assert admin.purge(URI) == 8
        stats = admin.stats(URI)
        assert (stats.ready, stats.unconfirmed, stats.consumers) == (0, 2, 1)
        for message in held:
            message.confirm()
        wait_until(lambda: admin.stats(URI).unconfirmed == 0, 5, "the confirms")
    assert len(got.messages) == 2


def test_delete_is_refused_while_open_and_forgets_everything_after(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    admin.set_policy(URI, QueuePolicy(max_deliveries=2))
    got = Collector(confirm=False)
    with Session(broker.address, options=FAST) as session:
        post_all(session, URI, [b"a", b"b"])
        handle = session.open_queue(URI, read=True, on_message=got)
        got.wait_for(2)
        with pytest.raises(QueueInUseError, match="1 open handles"):
            admin.delete(URI)
        assert admin.stats(URI).unconfirmed == 2  # nothing happened
        handle.close()
        assert admin.delete(URI) == 2
        with pytest.raises(QueueNotFoundError):
            admin.stats(URI)
        with pytest.raises(QueueNotFoundError):
            admin.delete(URI)
        post_all(session, URI, [b"fresh"])
        stats = admin.stats(URI)
    assert stats.ready == 1 and stats.policy == QueuePolicy()


def test_a_policy_survives_a_broker_restart_on_sqlite(tmp_path: Path) -> None:
    policy = QueuePolicy(
        max_deliveries=4, ttl=120.0, dead_letter="hf://shop/dlq", max_messages=10, max_bytes=9000
    )
    with BrokerProcess(["--store", f"sqlite:{tmp_path / 'b.db'}"]) as broker:
        with AdminClient(broker.address) as admin:
            admin.set_policy(URI, policy)
            admin.set_policy("hf://shop/k-*", QueuePolicy(redirect="hf://shop/o"))
        broker.kill()
        broker.restart()
        with AdminClient(broker.address) as admin:
            assert admin.policy(URI) == policy
            assert admin.policy("hf://shop/k-*") == QueuePolicy(redirect="hf://shop/o")
            admin.set_policy(URI, QueuePolicy())
        broker.restart()
        with AdminClient(broker.address) as admin, pytest.raises(QueueNotFoundError):
            admin.policy(URI)  # an empty queue with no policy is nothing to recover


def test_bad_policies_are_refused_with_a_typed_error(admin: AdminClient) -> None:
    from holdfast.proto.validate import Invalid
    from holdfast.sdk.errors import InvalidArgumentError

    with pytest.raises(Invalid, match="ttl"):
        QueuePolicy(ttl=-1)
    with pytest.raises(InvalidArgumentError, match="own dead-letter queue"):
        admin.set_policy(URI, QueuePolicy(dead_letter=URI))
    with pytest.raises(InvalidArgumentError, match="invalid queue URI"):
        admin.set_policy("hf://bad uri", QueuePolicy())
    with pytest.raises(QueueNotFoundError):
        admin.policy(URI)


def test_a_template_redirects_puts_of_queues_without_a_policy_of_their_own(
    broker: BrokerProcess, admin: AdminClient
) -> None:
    template, orphans = "hf://shop/pool.key-*", "hf://shop/pool.orphans"
    admin.set_policy(template, QueuePolicy(redirect=orphans))
    assert admin.policy(template) == QueuePolicy(redirect=orphans)
    with Session(broker.address, options=FAST) as session:
        keyed = session.open_queue("hf://shop/pool.key-a", write=True)
        guid = keyed.post(b"first")
        assert session.flush(timeout=10)
        assert admin.stats(orphans).ready == 1  # redirected
        keyed.post(b"first", guid=guid)  # a retransmit: deduplicated at the target
        assert session.flush(timeout=10)
        assert admin.stats(orphans).ready == 1
        assert admin.policy("hf://shop/pool.key-a").redirect == orphans  # inherited
        # A policy of its own binds the queue: its PUTs stay there.
        admin.set_policy("hf://shop/pool.key-a", QueuePolicy(max_deliveries=5))
        keyed.post(b"second")
        assert session.flush(timeout=10)
        assert admin.stats("hf://shop/pool.key-a").ready == 1
        # Cleared again, it falls back to the template.
        admin.set_policy("hf://shop/pool.key-a", QueuePolicy())
        keyed.post(b"third")
        assert session.flush(timeout=10)
    assert [m.payload for m in admin.peek(orphans)] == [b"first", b"third"]
    with pytest.raises(InvalidArgumentError, match="redirect to itself"):
        admin.set_policy(template, QueuePolicy(redirect="hf://shop/pool.key-x"))

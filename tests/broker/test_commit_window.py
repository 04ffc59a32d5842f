"""A transactional commit cut off between publishing its rows and recording its commit
mark, on a sqlite broker (``holdfast.broker.commit_records``).

The real broker runs in this process on a manual clock (the conformance harness). To
"kill" it exactly there, its ``MarkBook`` is made to never return from recording a mark;
the broker is then stopped, which abandons that commit as a kill would (nothing after
the mark runs: the book does not finish, the store is told nothing more), and a new
broker starts on the same files. It must find the rows published once, the mark
recorded and nothing staged, and answer a retried commit ``committed_before``,
publishing nothing, even after the rows were consumed and the dedup window passed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from holdfast.broker.config import BrokerConfig
from holdfast.broker.server import Broker
from holdfast.broker.staging import AttemptKey
from holdfast.proto import pb
from holdfast.proto.staged_rows import stage_rows
from holdfast.sdk import AckStatus
from holdfast.sdk.errors import CommitMarkConflictError, HoldfastError, RequestTimeoutError
from holdfast.sdk.marks import CommitMark
from holdfast.sdk.staging import Version, commit, stage
from tests.broker.test_in_process import GatedStore
from tests.conformance.harness import World, open_world
from tests.conformance.support import Inbox, peek, post_and_wait
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

APP = "app-1"
VERSION = 2
WINDOW = 5.0
"""The broker's dedup window, in seconds of its manual clock."""


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with open_world(
        "sqlite", f"sqlite:{tmp_path / 'broker.db'}", "direct", tmp_path, dedup_window=WINDOW
    ) as world:
        yield world


def rows(count: int, tag: str = "r") -> list[tuple[bytes, bytes, dict[str, str]]]:
    return [
        (uuid.uuid5(uuid.NAMESPACE_OID, f"{tag}-{i}").bytes, f"{tag}{i}".encode(), {"i": str(i)})
        for i in range(count)
    ]


def target(world: World, uri: str, timeout: float = 15.0) -> Version:
    return Version([world.address], uri, APP, VERSION, timeout=timeout)


def never_record_a_mark(broker: Broker) -> None:
    """From now on the broker "dies" in every commit right after its publishing: the
    call that would record the mark waits forever."""
    marks = broker.marks
    read = marks.handle

    async def handle(request: pb.CommitMarkRequest, context: Any = None) -> pb.CommitMarkReply:
        if request.record:
            await asyncio.Event().wait()
        return await read(request, context)

    marks.handle = handle  # type: ignore[method-assign]


def staged(world: World, uri: str, partition: int, attempt: int) -> int:
    key = AttemptKey(uri, APP, VERSION, partition, attempt)
    count: int = world.broker.call(lambda broker: broker.staging.book.staged_rows(key))
    return count


def mark_of(world: World, uri: str) -> CommitMark | None:
    with world.session() as session:
        return session.commit_mark(uri, APP, timeout=10.0)


def commit_cut_off_before_its_mark(world: World, uri: str, already_in_queue: bool) -> None:
    """Stage two attempts of one partition, commit the second, and restart the broker
    between the commit's publishing and its mark."""
    version = target(world, uri)
    assert stage(version, 0, 0, rows(40))
    assert stage(version, 0, 1, rows(40))
    if already_in_queue:
        # Every row is a duplicate of a stored message: the commit's store write has
        # no new message and must still carry its record.
        with world.session() as session:
            for guid, payload, properties in rows(40):
                status = post_and_wait(
                    session, uri, payload, guid=uuid.UUID(bytes=guid), properties=properties
                )
                assert status is AckStatus.SUCCESS, status
    world.broker.call(never_record_a_mark)
    with pytest.raises(HoldfastError):
        commit(target(world, uri, timeout=2.0), {(0, 1): 40}, b"digest", 40)
    assert len(peek(world, uri)) == 40  # published before the "kill"
    world.broker.restart()


@pytest.mark.parametrize("already_in_queue", [False, True], ids=["new-rows", "all-duplicates"])
def test_a_commit_cut_off_before_its_mark_is_completed_at_restart(
    world: World, already_in_queue: bool
) -> None:
    uri = world.uri("cut-off")
    commit_cut_off_before_its_mark(world, uri, already_in_queue)
    assert sorted(m.payload for m in peek(world, uri)) == sorted(p for _, p, _ in rows(40))
    mark = mark_of(world, uri)
    assert mark is not None and (mark.version, mark.digest, mark.rows) == (VERSION, b"digest", 40)
    assert staged(world, uri, 0, 0) == staged(world, uri, 0, 1) == 0
    again = commit(target(world, uri), {(0, 1): 40}, b"digest", 40)
    assert again.status == pb.STATUS_OK and again.committed_before and again.published == 0
    assert len(peek(world, uri)) == 40
    with pytest.raises(CommitMarkConflictError, match="other content"):
        commit(target(world, uri), {(0, 1): 40}, b"changed", 40)


def test_a_retry_after_the_rows_were_consumed_and_the_window_passed_publishes_nothing(
    world: World,
) -> None:
    uri = world.uri("consumed")
    commit_cut_off_before_its_mark(world, uri, already_in_queue=False)
    with world.session() as session:
        inbox = Inbox(lambda m: m.confirm())
        session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(40)
        wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "the confirms")
    assert peek(world, uri) == []
    world.time.advance(10 * WINDOW)  # the GUID history no longer knows the rows
    again = commit(target(world, uri), {(0, 1): 40}, b"digest", 40)
    assert peek(world, uri) == []
    assert again.committed_before and again.published == 0
    assert not stage(target(world, uri), 0, 2, rows(40))  # a late task has nothing to do


def test_a_commit_refused_in_part_is_not_recorded(world: World) -> None:
    """A row that conflicts with a stored message refuses the commit; the rows that were
    new are stored, but no record with them: a restart completes nothing, the mark stays
    absent and the version stays staged for the writer to deal with."""
    uri = world.uri("refused")
    guid, _, properties = rows(5)[0]
    with world.session() as session:
        status = post_and_wait(
            session, uri, b"other content", guid=uuid.UUID(bytes=guid), properties=properties
        )
        assert status is AckStatus.SUCCESS, status
    assert stage(target(world, uri), 0, 0, rows(5))
    with pytest.raises(CommitMarkConflictError):
        commit(target(world, uri), {(0, 0): 5}, b"digest", 5)
    world.broker.restart()
    assert mark_of(world, uri) is None
    assert staged(world, uri, 0, 0) == 5


def test_a_commit_whose_caller_gave_up_still_records_its_mark() -> None:
    """A commit whose caller gave up (its handler cancelled, as gRPC does when the
    deadline passes) while its rows' store write is pending runs to its end: the mark
    is recorded, and the caller's retry waits for it and publishes nothing."""
    uri = "hf://t/in-flight"
    store = GatedStore()

    def request(**action: Any) -> pb.StagingRequest:
        return pb.StagingRequest(queue_uri=uri, app_id=APP, version=VERSION, **action)

    commit_request = request(
        commit=pb.CommitStaged(
            attempts=[pb.StagedAttempt(partition=0, attempt=0, rows=5)], digest=b"d", rows=5
        )
    )

    async def scenario() -> None:
        broker = Broker(BrokerConfig(listen="127.0.0.1:0", store="memory"), store=store)
        broker.recover()
        staging = broker.staging
        reply = await staging.handle(request(stage=stage_rows(0, 0, rows(5))), None)
        assert reply.status == pb.STATUS_OK
        store.held.add(uri)
        abandoned = asyncio.create_task(staging.handle(commit_request, None))
        while not store.pending:
            await asyncio.sleep(0.01)
        abandoned.cancel()
        retry = asyncio.create_task(staging.handle(commit_request, None))
        await asyncio.sleep(0.2)
        assert not retry.done()  # waiting for the abandoned try to finish
        store.release()
        reply = await asyncio.wait_for(retry, 10)
        assert reply.status == pb.STATUS_OK and reply.committed_before, reply
        assert reply.published == 0
        mark = await broker.marks.handle(pb.CommitMarkRequest(queue_uri=uri, app_id=APP))
        assert mark.found and mark.mark.version == VERSION
        assert len(store.stored_guids()) == 5  # published once
        await broker.stop(0)

    asyncio.run(scenario())


def test_a_commit_past_its_deadline_is_recorded_and_a_rerun_publishes_nothing(
    world: World,
) -> None:
    """Over gRPC: the caller's deadline passes while the broker records the mark (held
    back here for a second); the caller gets a timeout, the commit completes, and the
    same version committed again after the rows were consumed and the dedup window
    passed answers ``committed_before`` and publishes nothing."""
    uri = world.uri("deadline")
    assert stage(target(world, uri), 0, 0, rows(40))

    def slow_marks(broker: Broker) -> None:
        record = broker.marks.handle

        async def handle(request: pb.CommitMarkRequest, context: Any = None) -> Any:
            if request.record:
                await asyncio.sleep(1.0)
            return await record(request, context)

        broker.marks.handle = handle  # type: ignore[method-assign]

    world.broker.call(slow_marks)
    with pytest.raises(RequestTimeoutError):
        commit(target(world, uri, timeout=0.3), {(0, 0): 40}, b"digest", 40)
    wait_until(lambda: mark_of(world, uri) is not None, 10, "the commit's mark")
    assert staged(world, uri, 0, 0) == 0
    with world.session() as session:
        inbox = Inbox(lambda m: m.confirm())
        session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(40)
        wait_until(lambda: world.admin.stats(uri).unconfirmed == 0, 10, "the confirms")
    world.time.advance(10 * WINDOW)
    again = commit(target(world, uri), {(0, 0): 40}, b"digest", 40)
    assert again.committed_before and again.published == 0
    assert peek(world, uri) == []

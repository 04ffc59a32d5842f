"""Transactional writes (the ``Staging`` call) on every store, directly and through the
proxy: staged rows are invisible; a commit publishes exactly the named attempts, once,
however late it is replayed (past the dedup window too); an abort discards; a GUID staged
by two named partitions refuses the commit whole; rows that are not all staged refuse
it. Every store serves it (Redis and Redis Cluster with one script per commit)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from holdfast.proto import pb
from holdfast.proto.policy import QueuePolicy
from holdfast.proto.staged_rows import StagedPut, stage_rows
from holdfast.sdk.errors import CommitMarkConflictError, InvalidArgumentError, RequestFailedError
from holdfast.sdk.staging import Version, abort, commit, stage
from tests.conformance.harness import World, open_world
from tests.conformance.support import peek

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]


def target(world: World, uri: str, version: int = 0) -> Version:
    return Version([world.address], uri, "app-1", version, timeout=15.0)


def rows(tag: str, count: int) -> list[tuple[bytes, bytes, dict[str, str]]]:
    return [
        (uuid.uuid5(uuid.NAMESPACE_OID, f"{tag}-{i}").bytes, f"{tag}{i}".encode(), {"i": str(i)})
        for i in range(count)
    ]


def test_a_commit_publishes_exactly_the_named_attempts_once(world: World) -> None:
    uri = world.uri("staged")
    version = target(world, uri)
    assert stage(version, 0, 0, rows("p0", 30))  # a failed attempt's rows
    assert stage(version, 0, 1, rows("p0", 50))  # its retry
    assert stage(version, 1, 7, rows("p1", 20))
    assert stage(version, 1, 8, rows("p1", 20))  # a speculative copy
    assert peek(world, uri) == []  # nothing staged is visible
    reply = commit(version, {(0, 1): 50, (1, 7): 20}, b"digest", 70)
    assert (reply.published, reply.discarded, reply.committed_before) == (70, 50, False)
    published = peek(world, uri)
    assert sorted(m.payload for m in published) == sorted(
        p for _, p, _ in rows("p0", 50) + rows("p1", 20)
    )
    world.time.advance(3600.0)  # far past the dedup window: the commit mark remembers
    assert not stage(version, 0, 2, rows("p0", 50))
    again = commit(version, {(0, 2): 50, (1, 7): 20}, b"digest", 70)
    assert again.committed_before and again.published == 0
    with pytest.raises(CommitMarkConflictError, match="other content"):
        commit(version, {(0, 1): 50}, b"changed", 50)
    assert len(peek(world, uri)) == 70


def test_an_abort_discards_and_a_commit_of_missing_rows_is_refused(world: World) -> None:
    uri = world.uri("aborted")
    version = target(world, uri, 4)
    stage(version, 0, 0, rows("a", 10))
    stage(version, 0, 0, rows("a", 10))  # a retried call adds nothing
    assert abort(version) == 10
    with pytest.raises(RequestFailedError, match="0 rows staged, the writer reported 10"):
        commit(version, {(0, 0): 10}, b"d", 10)
    assert peek(world, uri) == []


def test_a_guid_staged_by_two_named_partitions_refuses_the_commit_whole(world: World) -> None:
    uri = world.uri("repeated")
    version = target(world, uri, 1)
    stage(version, 0, 0, rows("k", 5))
    stage(version, 1, 0, rows("k", 3))  # the same keys, hence GUIDs, in partition 1
    with pytest.raises(CommitMarkConflictError, match="3 GUIDs were staged by more than one"):
        commit(version, {(0, 0): 5, (1, 0): 3}, b"d", 8)
    assert peek(world, uri) == []
    abort(version)


def test_staged_rows_and_a_commit_survive_a_broker_restart(durable_world: World) -> None:
    """On sqlite, rows staged before a restart are committed after it, once; a replayed
    commit after another restart is recognised (the mark)."""
    world = durable_world
    uri = world.uri("restart")
    version = target(world, uri, 2)
    assert stage(version, 0, 0, rows("r", 40))
    assert stage(version, 0, 1, rows("r", 40))
    world.broker.restart()
    reply = commit(version, {(0, 1): 40}, b"d", 40)
    assert (reply.published, reply.discarded) == (40, 40)
    world.broker.restart()
    assert commit(version, {(0, 1): 40}, b"d", 40).committed_before
    assert len(peek(world, uri)) == 40


def test_on_memory_a_restart_loses_staged_rows_and_the_commit_says_so(tmp_path: Path) -> None:
    with open_world("memory", "memory", "direct", tmp_path) as world:
        uri = world.uri("lost")
        version = target(world, uri, 0)
        stage(version, 0, 0, rows("m", 5))
        world.broker.restart()
        with pytest.raises(RequestFailedError, match=r"NOT_FOUND: .*0 rows staged"):
            commit(version, {(0, 0): 5}, b"d", 5)
        assert peek(world, uri) == []


def test_a_transactional_write_to_a_redirected_queue(world: World) -> None:
    """Memory and sqlite publish into the redirect's target, as a PUT would go; Redis
    refuses the write at its first stage (the target's keys are in another slot than
    the staged rows, so no one script could publish there), loudly and typed."""
    uri, moved_to = world.uri("redirected"), world.uri("moved-to")
    world.admin.set_policy(uri, QueuePolicy(redirect=moved_to))
    version = target(world, uri, 0)
    if world.store_kind.startswith("redis"):
        with pytest.raises(InvalidArgumentError, match="write to the target queue"):
            stage(version, 0, 0, rows("m", 5))
        assert peek(world, moved_to) == []
        return
    assert stage(version, 0, 0, rows("m", 5))
    assert commit(version, {(0, 0): 5}, b"d", 5).published == 5
    assert len(peek(world, moved_to)) == 5


def test_a_stage_call_whose_columns_disagree_is_refused_and_stages_nothing(world: World) -> None:
    """Rows travel as columns (``proto.staged_rows``): a call whose payload lengths do
    not cover its GUIDs cannot be split into rows and is refused whole, typed."""
    uri = world.uri("malformed")
    version = target(world, uri)
    good = stage_rows(0, 1, rows("m", 3))
    bad = pb.StageRows()
    bad.CopyFrom(good)
    del bad.payload_lengths[-1]
    with pytest.raises(RequestFailedError, match="MALFORMED_FRAME"):
        version.call(pb.StagingRequest(stage=bad))
    with pytest.raises(RequestFailedError, match="0 rows staged, the writer reported 3"):
        commit(version, {(0, 1): 3}, b"digest", 3)
    version.call(pb.StagingRequest(stage=good))
    assert commit(version, {(0, 1): 3}, b"digest", 3).published == 3
    assert sorted(m.payload for m in peek(world, uri)) == [b"m0", b"m1", b"m2"]


def test_rows_with_empty_payloads_stage_commit_and_abort(world: World) -> None:
    """An empty payload is a valid message: a version of them (0 bytes staged) stages
    (twice: the retry adds nothing), aborts and commits like any other."""
    uri = world.uri("empty")
    empty: list[StagedPut] = [
        (uuid.uuid5(uuid.NAMESPACE_OID, f"e-{i}").bytes, b"", {}) for i in range(4)
    ]
    aborted, kept = target(world, uri, 1), target(world, uri, 2)
    assert stage(aborted, 0, 0, empty[:2]) and stage(aborted, 0, 0, empty[:2])
    assert abort(aborted) == 2
    assert stage(kept, 0, 0, empty[2:])
    assert commit(kept, {(0, 0): 2}, b"digest", 2).published == 2
    assert [m.payload for m in peek(world, uri)] == [b"", b""]

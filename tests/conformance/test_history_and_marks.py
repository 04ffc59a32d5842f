"""HISTORY_FULL and commit marks.

HISTORY_FULL (memory and sqlite: on Redis the history is Redis's, bounded by Redis's
memory, not ``--history-max-guids``, as the README says): past the broker's bound a
PUT gets no outcome; the SDK keeps it and it goes in once the history has room again
(entries expire after the window and grace, on the broker's manual clock).

Commit marks, on every store and both paths: a newer version replaces the mark, the
same version and digest is a replay, other content is a conflict, an older version
changes nothing; marks are per application and per queue. On sqlite they survive a
broker restart (on Redis they are in Redis itself, tested in tests/redis/test_staging.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from holdfast.sdk import AckStatus
from holdfast.sdk.errors import CommitMarkConflictError
from holdfast.sdk.types import Ack
from tests.conformance.conftest import PATHS, store_spec
from tests.conformance.harness import World, open_world
from tests.conformance.support import Inbox, peek, wait_ready
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]

BOUND = 3
WINDOW = 20.0
GRACE = 5.0


@pytest.fixture(
    scope="module",
    params=[(s, p) for s in ("memory", "sqlite") for p in PATHS],
    ids=[f"{s}-{p}" for s in ("memory", "sqlite") for p in PATHS],
)
def bounded_world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """A broker whose GUID history holds ``BOUND`` GUIDs."""
    kind, path = request.param
    directory = tmp_path_factory.mktemp(f"{kind}-{path}-bounded")
    spec = store_spec(kind, request, directory)
    with open_world(
        kind,
        spec,
        path,
        directory,
        dedup_max_guids=BOUND,
        dedup_window=WINDOW,
        dedup_grace=GRACE,
    ) as world:
        yield world


def test_a_full_history_pushes_back_until_entries_expire_then_takes_the_put_once(
    bounded_world: World,
) -> None:
    world = bounded_world
    uri = world.uri("history")
    acks: list[Ack] = []
    with world.session() as session:
        queue = session.open_queue(uri, write=True, on_ack=acks.append)
        guids = [queue.post(b"m%d" % i) for i in range(BOUND + 1)]
        wait_until(lambda: len(acks) >= BOUND, 15, f"{BOUND} ACKs")
        assert not session.flush(timeout=0.5)
        assert len(peek(world, uri)) == BOUND
        # Consume what is queued (a live message's GUID stays known), then let the
        # history's entries run out: the pushed-back PUT goes in by itself.
        inbox = Inbox(lambda m: m.confirm())
        reader = session.open_queue(uri, read=True, on_message=inbox)
        inbox.wait(BOUND)
        reader.close()
        assert not session.flush(timeout=0.3)
        world.time.advance(WINDOW + GRACE + 1)
        assert session.flush(timeout=20), "the pushed-back PUT never went in"
    assert {a.guid: a.status for a in acks} == {g: AckStatus.SUCCESS for g in guids}
    assert [m.payload for m in wait_ready(world, uri, 1)] == [b"m%d" % BOUND]


def test_commit_marks_replace_replay_conflict_and_ignore_older(world: World) -> None:
    uri, other = world.uri("marks"), world.uri("marks")
    with world.session() as session:
        assert session.commit_mark(uri, "app") is None
        mark = session.commit_mark(uri, "app", 3, digest=b"d3", rows=10)
        assert mark is not None and (mark.version, mark.digest, mark.rows) == (3, b"d3", 10)
        assert session.commit_mark(uri, "app", 3, digest=b"d3", rows=10) == mark
        assert session.commit_mark(uri, "app", 2, digest=b"d2", rows=5) == mark
        with pytest.raises(CommitMarkConflictError):
            session.commit_mark(uri, "app", 3, digest=b"changed", rows=10)
        assert session.commit_mark(uri, "app") == mark
        newer = session.commit_mark(uri, "app", 4, digest=b"d4", rows=1)
        assert newer is not None and (newer.version, newer.digest) == (4, b"d4")
        assert session.commit_mark(uri, "other-app") is None
        assert session.commit_mark(other, "app") is None


@pytest.fixture(scope="module")
def sqlite_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A sqlite broker seen directly: the store that keeps commit marks on disk."""
    directory = tmp_path_factory.mktemp("sqlite-marks")
    with open_world("sqlite", f"sqlite:{directory / 'broker.db'}", "direct", directory) as world:
        yield world


def test_commit_marks_survive_a_restart_of_a_sqlite_broker(sqlite_world: World) -> None:
    world = sqlite_world
    uri = world.uri("marks")
    with world.session() as session:
        mark = session.commit_mark(uri, "app", 7, digest=b"d7", rows=2)
    world.broker.restart()
    with world.session() as session:
        assert session.commit_mark(uri, "app") == mark
        with pytest.raises(CommitMarkConflictError):
            session.commit_mark(uri, "app", 7, digest=b"other", rows=2)

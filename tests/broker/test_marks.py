"""Commit marks: recorded by the broker, kept across a restart with the sqlite store,
relayed by the proxy, and a replay of a version with other content is a conflict."""

from __future__ import annotations

from pathlib import Path

import pytest

from holdfast.sdk import Session
from holdfast.sdk.errors import CommitMarkConflictError, InvalidArgumentError
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST, unique_uri


def test_marks_survive_a_broker_restart_and_go_through_the_proxy(tmp_path: Path) -> None:
    uri = unique_uri("marks")
    store = f"sqlite:{tmp_path / 'broker.db'}"
    with BrokerProcess(["--store", store, "--dedup-window", "1"]) as broker:
        with (
            ProxyProcess(["--upstream", broker.address]) as proxy,
            Session(proxy.address, options=FAST) as session,
        ):
            assert session.commit_mark(uri, "query-1") is None
            mark = session.commit_mark(uri, "query-1", 3, digest=b"d3", rows=10)
            assert mark is not None and (mark.version, mark.digest, mark.rows) == (
                3,
                b"d3",
                10,
            )
            # The same version and digest again: a replay, nothing changes.
            again = session.commit_mark(uri, "query-1", 3, digest=b"d3", rows=10)
            assert again == mark
            # An older version changes nothing; the newer mark is returned.
            older = session.commit_mark(uri, "query-1", 2, digest=b"d2", rows=5)
            assert older == mark
            with pytest.raises(CommitMarkConflictError, match="other content"):
                session.commit_mark(uri, "query-1", 3, digest=b"changed", rows=10)
            # Marks are per application and per queue.
            assert session.commit_mark(uri, "query-2") is None
            assert session.commit_mark(unique_uri("other"), "query-1") is None
        broker.kill()
        broker.restart()
        with Session(broker.address, options=FAST) as session:
            recovered = session.commit_mark(uri, "query-1")
            assert recovered == mark


def test_invalid_mark_requests_are_refused_with_a_typed_error() -> None:
    with BrokerProcess() as broker, Session(broker.address, options=FAST) as session:
        with pytest.raises(InvalidArgumentError, match="expected hf://"):
            session.commit_mark("nope", "app")
        with pytest.raises(InvalidArgumentError, match="app_id"):
            session.commit_mark(unique_uri("m"), "")
        with pytest.raises(InvalidArgumentError, match="digest"):
            session.commit_mark(unique_uri("m"), "app", 1, digest=b"x" * 65)
        with pytest.raises(InvalidArgumentError, match=">= 0"):
            session.commit_mark(unique_uri("m"), "app", -1)

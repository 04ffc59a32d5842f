"""The driver's commit of a ``format("holdfast")`` write that gets no answer within
``commitTimeout`` (no JVM: ``commit_version`` is called as Spark's driver calls it,
against the real broker in this process on a sqlite store).

The broker completes a commit it has begun, so the driver's error must not say the
write left nothing: it says the commit may have completed and that a re-run under the
same run id is safe, and the re-run adds nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from holdfast.broker.server import Broker
from holdfast.proto import pb
from holdfast.sdk.spark.commit import commit_version
from holdfast.sdk.spark.guids import BatchDigest
from holdfast.sdk.spark.options import parse_write_options
from holdfast.sdk.spark.post import SinkError
from holdfast.sdk.spark.task import STAGED, TaskReport
from holdfast.sdk.spark.writer import _aborted
from holdfast.sdk.staging import Version, stage
from tests.conformance.harness import World, open_world
from tests.conformance.support import peek
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

RUN = "ct-1"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with open_world("sqlite", f"sqlite:{tmp_path / 'b.db'}", "direct", tmp_path) as world:
        yield world


def slow_marks(broker: Broker) -> None:
    """Recording a mark takes a second: longer than the driver's commitTimeout."""
    record = broker.marks.handle

    async def handle(request: pb.CommitMarkRequest, context: Any = None) -> Any:
        if request.record:
            await asyncio.sleep(1.0)
        return await record(request, context)

    broker.marks.handle = handle  # type: ignore[method-assign]


def test_a_commit_past_commit_timeout_says_a_rerun_is_safe_and_the_rerun_adds_nothing(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = world.uri("commit-timeout")
    rows: list[tuple[bytes, bytes, dict[str, str]]] = [
        (uuid.uuid4().bytes, f"r{i}".encode(), {}) for i in range(30)
    ]
    assert stage(Version([world.address], uri, RUN, 0, timeout=10.0), 0, 7, rows)
    digest = BatchDigest()
    for guid, payload, _ in rows:
        digest.add_bytes(guid, payload)
    report = TaskReport(RUN, 0, 0, 30, 30, digest.value, False, 0.1, attempt=7, mode=STAGED)
    world.broker.call(slow_marks)

    def options(timeout: str) -> Any:
        raw = {"uri": uri, "address": world.address, "runId": RUN, "commitTimeout": timeout}
        return parse_write_options(raw, ["id"])

    with pytest.raises(SinkError, match=r"may have completed it.*same runId is safe"):
        commit_version(options("0.3"), [report], 0)
    wait_until(lambda: len(peek(world, uri)) == 30, 10, "the commit's rows")
    # Spark then aborts the write: the abort says what is true, that it was committed.
    _aborted(options("10"), [report], 0, RUN)
    assert "was committed after all" in capsys.readouterr().err
    commit_version(options("10"), [report], 0)  # the re-run
    assert "already committed; this replay wrote nothing" in capsys.readouterr().err
    assert len(peek(world, uri)) == 30

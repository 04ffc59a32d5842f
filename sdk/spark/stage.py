"""One partition staged with the broker (transactional writes): nothing is visible until
the driver commits the version, naming this attempt among those Spark committed.

A task stages its rows in chunks under (application, version, partition, attempt),
where the attempt is Spark's task attempt id (unique within the application, so a
retry, a speculative copy and a re-run stage never mix). Staging a GUID again in the
same attempt replaces it, so a retried call adds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from holdfast.proto.staged_rows import StagedPut
from holdfast.sdk.spark.guids import BatchDigest, RowGuids
from holdfast.sdk.spark.post import PartitionResult, WriteSpec, encoded_bytes, row_properties
from holdfast.sdk.spark.rows import Record
from holdfast.sdk.staging import Stager, Version

CHUNK_ROWS = 5_000
"""Most rows per ``Staging`` call."""

CHUNK_BYTES = 1 << 20
"""Payload bytes after which a chunk is sent (the call stays well under gRPC's 4 MiB)."""


def task_attempt() -> int:
    """The running task's attempt id, unique within the Spark application (0 outside)."""
    try:
        from pyspark import TaskContext
    except ImportError:  # not under Spark
        return 0
    context: Any = TaskContext.get()
    return 0 if context is None else int(context.taskAttemptId())


def stage_rows(
    spec: WriteSpec,
    rows: Iterable[Record],
    run_id: str,
    partition: int,
    target: Version,
    attempt: int,
) -> tuple[PartitionResult, bool]:
    """Stage every row of the partition; the result (its digest covers every row) and
    whether all were staged (False: the version turned out to be committed meanwhile,
    and staging stopped there)."""
    started = time.monotonic()
    guids = RowGuids(spec.uri, run_id, spec.key_column, partition)
    digest = BatchDigest()
    chunk: list[StagedPut] = []
    size = 0
    stager = Stager(target, partition, attempt)
    try:
        for row in rows:
            payload, guid, key = encoded_bytes(spec, guids, row)
            digest.add_bytes(guid, payload)
            if not stager.open:
                continue
            chunk.append((guid, payload, row_properties(spec, row, key)))
            size += len(payload)
            if len(chunk) >= CHUNK_ROWS or size >= CHUNK_BYTES:
                stager.send(chunk)
                chunk, size = [], 0
        if chunk:
            stager.send(chunk)
        staging = stager.finish()
    finally:
        stager.close()
    result = PartitionResult(
        digest.rows if staging else 0,
        {"STAGED": digest.rows} if staging else {},
        time.monotonic() - started,
        digest,
        b"".join(guids.key_fingerprints),
    )
    return result, staging

"""Loud resets: a run id whose recorded history does not match the query using it.

A streaming query's versions are its batch ids, and Spark only ever replays the batch
after the last one its checkpoint recorded as done, so a query can legitimately meet a
commit mark at its own version (the sink committed, Spark had not recorded it yet) or
below it, never above. A mark *above* the batch being written means the run id's
history belongs to another checkpoint: a query restarted from a new (or deleted)
checkpoint under a reused ``runId``. Treating its batches as already committed would drop
them silently, so the writer refuses instead, before anything is written.
"""

from __future__ import annotations

from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.marks import CommitMark


class RunHistoryError(InvalidArgumentError):
    """The run id was committed further than this query has come: its checkpoint is
    not the one that history belongs to (see the module docstring)."""


def check_history(uri: str, app_id: str, version: int, mark: CommitMark | None) -> None:
    """Raise ``RunHistoryError`` if ``mark`` is ahead of ``version``."""
    if mark is None or mark.version <= version:
        return
    raise RunHistoryError(
        f"application {app_id[:200]!r} has committed up to version {mark.version} on {uri} "
        f"({mark.rows} rows in that version), but this query is writing version {version}: "
        "its checkpoint does not match the recorded history (a new or deleted checkpoint "
        "with a reused runId?). Nothing of this version was written. To start afresh, give "
        "the query a new runId (or drop the runId option so the checkpoint's query id is "
        "used); to continue the old run, restore the checkpoint it was using."
    )

"""The exactly-once source's write-ahead log: one file per micro-batch, on storage the user names.

Layout of ``walPath`` (one directory per query)::

    <start>-<end>.seg    a batch taken from the queue and not yet committed by Spark
    <start>-<end>.done   a committed batch, kept to recognise redeliveries of its messages
    committed            the end offset of the last batch Spark committed

A segment holds one JSON line per message (GUID, base64 payload, properties, queue,
acceptance time, delivery count). It is written to a temporary name, fsynced and
renamed before the driver returns the batch's end offset to Spark, so a batch Spark
has planned is always on storage. Executors read segments directly (the storage must
be reachable from them: a shared mount; a local path works in local mode only).
"""

from __future__ import annotations

import base64
import json
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.spark.columns import SourceRow, source_row

_SEGMENT = re.compile(r"^(\d{20})-(\d{20})\.(seg|done)$")


class WalError(HoldfastError):
    """A batch Spark asks for is not in the write-ahead log (the log was removed, or
    belongs to another query)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One batch's file."""

    start: int
    end: int
    path: Path
    committed: bool


def encode_row(row: SourceRow) -> str:
    """One JSON line."""
    _, payload, properties, queue, guid, timestamp, count = row
    return json.dumps(
        {
            "g": guid,
            "p": base64.b64encode(payload).decode(),
            "h": properties,
            "q": queue,
            "t": timestamp.timestamp(),
            "d": count,
        },
        separators=(",", ":"),
    )


def decode_row(line: str) -> SourceRow:
    """The row of one JSON line."""
    item = json.loads(line)
    guid = uuid.UUID(item["g"])
    payload = base64.b64decode(item["p"])
    return source_row(guid, payload, item["h"], item["q"], float(item["t"]), int(item["d"]))


def read_segment(path: str) -> Iterator[SourceRow]:
    """The rows of a segment file (on an executor)."""
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                yield decode_row(line)
    except FileNotFoundError:
        raise WalError(f"write-ahead log segment {path} is missing") from None


class WriteAheadLog:
    """The segments of one query's ``walPath``."""

    def __init__(self, path: str) -> None:
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)

    def segments(self) -> list[Segment]:
        """Every segment, in offset order."""
        found = []
        for entry in self.root.iterdir():
            match = _SEGMENT.match(entry.name)
            if match:
                start, end, kind = match.groups()
                found.append(Segment(int(start), int(end), entry, kind == "done"))
        return sorted(found, key=lambda s: s.start)

    def committed_end(self) -> int:
        """The end offset of the last committed batch (0: none)."""
        try:
            return int((self.root / "committed").read_text())
        except FileNotFoundError:
            return 0

    def write(self, start: int, end: int, rows: Iterable[SourceRow]) -> Segment:
        """Write a batch durably (fsync, rename, fsync the directory)."""
        path = self.root / f"{start:020d}-{end:020d}.seg"
        temporary = self.root / f".{path.name}.{uuid.uuid4().hex}.tmp"
        with open(temporary, "w", encoding="utf-8") as out:
            for row in rows:
                out.write(encode_row(row) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        self._sync_directory()
        return Segment(start, end, path, False)

    def mark_committed(self, end: int, retention: int) -> int:
        """Record that Spark committed every batch up to ``end``; keep the newest
        ``retention`` committed segments (their GUIDs recognise redeliveries). Returns
        the end offset of the newest segment removed (0: none was)."""
        marker = self.root / "committed"
        temporary = self.root / f".committed.{uuid.uuid4().hex}.tmp"
        temporary.write_text(str(end))
        with open(temporary, "rb+") as out:
            os.fsync(out.fileno())
        os.replace(temporary, marker)
        for segment in self.segments():
            if not segment.committed and segment.end <= end:
                segment.path.rename(segment.path.with_suffix(".done"))
        done = [s for s in self.segments() if s.committed]
        pruned = 0
        for segment in done[: max(0, len(done) - retention)]:
            segment.path.unlink(missing_ok=True)
            pruned = max(pruned, segment.end)
        self._sync_directory()
        return pruned

    def _sync_directory(self) -> None:
        descriptor = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def guids_of(segment: Segment) -> set[uuid.UUID]:
    """The GUIDs of a segment's messages."""
    return {uuid.UUID(row[4]) for row in read_segment(str(segment.path))}

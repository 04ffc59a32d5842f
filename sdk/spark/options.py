"""The options of ``format("holdfast")``, parsed and checked on the driver.

Spark hands a data source its options as strings (case-insensitive names). They are
checked when the writer or reader is created, on the driver, before any task runs, so
a typo fails the query at once with an ``InvalidArgumentError`` naming the option.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from holdfast.proto.limits import MAX_APP_ID_BYTES
from holdfast.proto.validate import parse_queue_uri
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.failover import parse_addresses
from holdfast.sdk.options import DEFAULT_ADDRESS

WRITE_OPTIONS = (
    "uri",
    "address",
    "keyColumn",
    "runId",
    "flushTimeout",
    "openTimeout",
    "commitTimeout",
)
STREAM_READ_OPTIONS = (
    "uri",
    "address",
    "walPath",
    "maxRowsPerBatch",
    "openTimeout",
    "walRetention",
)
BATCH_READ_OPTIONS = ("uri", "address", "maxRowsPerBatch", "openTimeout", "consume")
READ_OPTIONS = (*STREAM_READ_OPTIONS, "consume")
"""Every read option; each read mode takes its own (``STREAM_READ_OPTIONS``,
``BATCH_READ_OPTIONS``) and refuses the other's, which it would ignore."""
_STREAM_ONLY = (
    "applies only to streaming reads (spark.readStream): a batch read (spark.read) "
    "has no write-ahead log"
)
_BATCH_ONLY = (
    "applies only to batch reads (spark.read): a streaming read always consumes, "
    "confirming each batch once Spark has committed it"
)
# Options Spark itself adds or the user may pass for Spark (not for us).
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

DEFAULT_MAX_ROWS_PER_BATCH = 10_000
"""Most messages one streaming read batch takes."""

MAX_ROWS_PER_BATCH = 10_000_000
"""Most ``maxRowsPerBatch`` allowed: the source holds up to four batches' messages
unconfirmed on the driver (the SDK's ``max_unconfirmed_messages`` is below 2**32)."""

MIN_COMMIT_TIMEOUT = 0.1
"""Least ``commitTimeout``: shorter could not cover even one round trip to the broker."""

DEFAULT_WAL_RETENTION = 100
"""Committed batches whose GUIDs the exactly-once reader keeps to recognise redeliveries."""

DEFAULT_COMMIT_TIMEOUT = 60.0
"""Seconds the driver's commit of a version may take with the broker (retries across
addresses included)."""

DEFAULT_PORT = int(DEFAULT_ADDRESS.rpartition(":")[2])
"""The port an ``address`` entry without one gets: the SDK's default (the sidecar's)."""


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """``df.write`` / ``df.writeStream`` options of ``format("holdfast")``.

    ``uri`` (required): the queue, ``hf://<domain>/<queue>``. ``address``: the proxy or
    broker, ``HOST:PORT[,HOST:PORT...]`` (default: ``$HOLDFAST_ADDRESS`` on each
    executor, else ``127.0.0.1:7701``). ``keyColumn``: a column whose values are unique
    across the run (default: content keys). ``runId``: fixes the run id (default: a job
    UUID for a batch write; the streaming query id from the checkpoint for a stream).
    ``flushTimeout``/``openTimeout``: seconds, as for ``QueueSink`` (a task's reading
    of the commit mark is bounded by ``openTimeout`` too). ``commitTimeout``: seconds
    the driver's commit with the broker may take.
    """

    uri: str
    address: str | None = None
    key_column: str | None = None
    run_id: str | None = None
    flush_timeout: float = 120.0
    open_timeout: float = 30.0
    commit_timeout: float = DEFAULT_COMMIT_TIMEOUT


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """``spark.readStream`` / ``spark.read`` options of ``format("holdfast")``.

    ``uri`` (required) and ``address`` as for writes. ``walPath`` (streaming reads
    only): a directory on storage that survives the driver (HDFS, a shared mount; local
    only in local mode) for the exactly-once mode's write-ahead log; without it the
    source is at-least-once. ``maxRowsPerBatch``: most messages per micro-batch (or
    per chunk of a consuming batch read). ``walRetention`` (streaming reads only):
    committed batches remembered to drop redeliveries. ``consume`` (batch reads only,
    ``true``/``false``, default false): take the messages off the queue instead of
    peeking at them.
    """

    uri: str
    address: str | None = None
    wal_path: str | None = None
    max_rows_per_batch: int = DEFAULT_MAX_ROWS_PER_BATCH
    open_timeout: float = 30.0
    wal_retention: int = DEFAULT_WAL_RETENTION
    consume: bool = False


def _lookup(
    options: Mapping[str, str], known: Iterable[str], elsewhere: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The options by their canonical names; unknown names are an error, and so are
    the names in ``elsewhere`` (canonical name -> why this mode does not take it)."""
    canonical = {name.lower(): name for name in known}
    refused = {name.lower(): (name, why) for name, why in (elsewhere or {}).items()}
    found: dict[str, str] = {}
    for name, value in options.items():
        key = canonical.get(name.lower())
        if key is None:
            if name.lower() in _SPARK_OPTIONS:
                continue
            if name.lower() in refused:
                other, why = refused[name.lower()]
                raise InvalidArgumentError(f"option {other} {why}")
            raise InvalidArgumentError(
                f"format('holdfast') has no option {name[:100]!r}; "
                f"it knows {', '.join(sorted(canonical.values()))}"
            )
        found[key] = value
    return found


def _common(found: Mapping[str, str]) -> tuple[str, str | None]:
    uri = found.get("uri")
    if not uri:
        raise InvalidArgumentError(
            "format('holdfast') needs .option('uri', 'hf://<domain>/<queue>')"
        )
    try:
        parse_queue_uri(uri)
    except ValueError as error:
        raise InvalidArgumentError(f"option uri: {error}") from None
    address = found.get("address")
    if address is not None and not address.strip():
        # Left empty it would mean the local default, which surprises more than it helps.
        raise InvalidArgumentError(
            "option address must not be empty (leave it out for the default)"
        )
    if address is not None:
        address = with_default_port(address)
        parse_addresses(address)
    return uri, address


def with_default_port(address: str) -> str:
    """``address`` with ``DEFAULT_PORT`` added to each entry that names no port
    (``localhost`` -> ``localhost:7701``; ``[::1]`` -> ``[::1]:7701``)."""
    entries = []
    for entry in (part.strip() for part in address.split(",")):
        if not entry:
            continue
        bracketed = entry.startswith("[") and entry.endswith("]")
        if bracketed or (":" not in entry and "/" not in entry):
            entry = f"{entry}:{DEFAULT_PORT}"
        entries.append(entry)
    return ",".join(entries)


def _flag(found: Mapping[str, str], name: str) -> bool:
    text = found.get(name)
    if text is None:
        return False
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise InvalidArgumentError(f"option {name} must be true or false, not {text[:100]!r}")
    return value == "true"


def _positive(found: Mapping[str, str], name: str, default: float) -> float:
    text = found.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgumentError(f"option {name}: {text[:100]!r} is not a number") from None
    # NaN and infinity too: a timeout of NaN never ran out (a write hung), and no
    # clock or count takes infinity.
    if not 0 < value < math.inf:
        raise InvalidArgumentError(f"option {name} must be > 0 and finite, not {text[:100]!r}")
    return value


def _count(found: Mapping[str, str], name: str, default: int) -> int:
    value = _positive(found, name, default)
    if value != int(value):
        raise InvalidArgumentError(f"option {name} must be a whole number")
    return int(value)


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_write_options(options: Mapping[str, str], columns: Iterable[str]) -> WriteOptions:
    """Check the write options against the DataFrame's columns."""
    found = _lookup(options, WRITE_OPTIONS)
    uri, address = _common(found)
    key_column = found.get("keyColumn")
    if key_column is not None and not key_column.strip():
        raise InvalidArgumentError(
            "option keyColumn must not be empty (leave it out for content keys)"
        )
    if key_column is not None:
        key_column = resolve_column("keyColumn", key_column, list(columns))
    run_id = found.get("runId")
    if run_id is not None and not run_id.strip():
        raise InvalidArgumentError("option runId must not be empty")
    if run_id is not None and not _is_utf8(run_id):
        raise InvalidArgumentError("option runId is not valid Unicode text (a lone surrogate)")
    if run_id is not None and len(run_id.encode()) > MAX_APP_ID_BYTES:
        # The run id names the commit mark, which the broker keeps to this length.
        raise InvalidArgumentError(
            f"option runId is {len(run_id.encode())} bytes; at most {MAX_APP_ID_BYTES}"
        )
    return WriteOptions(
        uri,
        address,
        key_column,
        run_id,
        _positive(found, "flushTimeout", 120.0),
        _positive(found, "openTimeout", 30.0),
        _commit_timeout(found),
    )


def resolve_column(option: str, name: str, columns: Sequence[str]) -> str:
    """The column of ``columns`` that ``name`` means, in the DataFrame's spelling (rows
    are read by it), matched ignoring case as Spark matches column names by default
    (``spark.sql.caseSensitive=false``). Spark hands a Python data source its options
    but not the session's conf: a name spelled exactly as one column is that column
    (what ``caseSensitive=true`` would pick), and one that matches several columns only
    ignoring case is refused as ambiguous."""
    if name in columns:
        return name
    matches = [column for column in columns if column.lower() == name.lower()]
    if not matches:
        raise InvalidArgumentError(
            f"option {option}: no column {name[:100]!r} in the DataFrame "
            f"(columns: {', '.join(columns)[:300]})"
        )
    if len(matches) > 1:
        raise InvalidArgumentError(
            f"option {option}: {name[:100]!r} matches columns "
            f"{' and '.join(repr(m[:100]) for m in matches[:5])}, which differ only in case "
            "(Spark compares column names ignoring case); rename all but one of them"
        )
    return matches[0]


def _commit_timeout(found: Mapping[str, str]) -> float:
    value = _positive(found, "commitTimeout", DEFAULT_COMMIT_TIMEOUT)
    if value < MIN_COMMIT_TIMEOUT:
        raise InvalidArgumentError(
            f"option commitTimeout must be at least {MIN_COMMIT_TIMEOUT} s, not {value:g}"
        )
    return value


def _max_rows(found: Mapping[str, str]) -> int:
    value = _count(found, "maxRowsPerBatch", DEFAULT_MAX_ROWS_PER_BATCH)
    if value > MAX_ROWS_PER_BATCH:
        raise InvalidArgumentError(
            f"option maxRowsPerBatch must be at most {MAX_ROWS_PER_BATCH:,}, not {value:,}"
        )
    return value


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check the options of a streaming read (``spark.readStream``) or, with
    ``streaming=False``, of a batch read (``spark.read``); an option of the other mode
    is refused, naming it."""
    if streaming:
        found = _lookup(options, STREAM_READ_OPTIONS, {"consume": _BATCH_ONLY})
    else:
        elsewhere = {"walPath": _STREAM_ONLY, "walRetention": _STREAM_ONLY}
        found = _lookup(options, BATCH_READ_OPTIONS, elsewhere)
    uri, address = _common(found)
    wal_path = found.get("walPath") or None
    if wal_path is not None and os.path.exists(wal_path) and not os.path.isdir(wal_path):
        raise InvalidArgumentError(f"option walPath: {wal_path[:200]!r} is a file, not a folder")
    return ReadOptions(
        uri,
        address,
        wal_path,
        _max_rows(found),
        _positive(found, "openTimeout", 30.0),
        _count(found, "walRetention", DEFAULT_WAL_RETENTION),
        _flag(found, "consume"),
    )

"""``QueueSink``: write a DataFrame from ``foreachPartition`` / ``foreachBatch``.

::

    from holdfast.sdk.spark import QueueSink

    sink = QueueSink("hf://demo/orders", run_id="orders-2024-06-01", key_column="order_id")
    df.foreachPartition(sink)                       # a batch job

    (stream.writeStream                             # Structured Streaming
        .foreachBatch(QueueSink("hf://demo/orders", run_id="orders-stream").write_batch)
        .option("checkpointLocation", "/checkpoints/orders")
        .start())

Prefer the ``format("holdfast")`` connector (``holdfast.sdk.spark.register``): it fixes
run ids by itself, checks key repeats across partitions and records commit marks so a
replay past the dedup window adds nothing. ``QueueSink`` has none of that: its
protection against replays is the broker's dedup window, and a key repeated in two
partitions is not detected.

Rows get deterministic GUIDs (``holdfast.sdk.spark.guids``), so a retried task posts the
same GUIDs and the broker drops the replays. Exactly once when: the input is
deterministic for a run id; every retry re-posts a row within the broker's dedup
window (``--dedup-window``) of the first post; with content keys, a re-run splits rows
into the same partitions; with a key column, keys are unique across the run; the
broker keeps its history across restarts (``--store sqlite:PATH``).

**Payloads.** By default a row becomes compact JSON of ``row.asDict(recursive=True)``
in column order (dates and timestamps as ISO 8601, decimals as strings, binary as
base64, intervals as seconds); ``serializer`` maps a row to bytes for anything else.
``properties_from`` names columns sent as message properties (null values left out).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.failover import parse_addresses
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.spark.options import with_default_port
from holdfast.sdk.spark.post import PartitionResult, WriteSpec, post_rows, task_partition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

SinkResult = PartitionResult
"""What one partition attempt did (``posted``, ``counts`` by status, ``seconds``)."""


@dataclass(frozen=True)
class QueueSink:
    """Writes rows into one queue with deterministic GUIDs; picklable, so Spark can
    ship it to executors.

    - ``df.foreachPartition(sink)`` writes a DataFrame (``__call__`` takes a
      partition's row iterator);
    - ``stream.writeStream.foreachBatch(sink.write_batch)`` writes each micro-batch
      under the run id ``f"{run_id}/batch/{batch_id}"``, so a batch re-run after a
      restart (same batch id) within the dedup window adds nothing. For streaming,
      ``run_id`` names the query and must stay the same across its restarts (its
      checkpoint path will do; not ``StreamingQuery.runId``, which changes).

    ``address``: the proxy or broker, ``HOST[:PORT][,HOST[:PORT]...]`` (an entry
    without a port gets 7701, as in the connector's ``address`` option; default
    ``$HOLDFAST_ADDRESS`` on the executor, else ``127.0.0.1:7701``). ``key_column``: a
    column whose value identifies a row within the run (default: the row's content,
    its partition and its occurrence).
    ``serializer``: row -> payload bytes (default: ``row_to_json``).
    ``properties_from``: columns sent as message properties. ``session_options``:
    for the task's ``Session``. ``flush_timeout``: seconds a task waits for its ACKs
    (and, at most, for back-pressure on one ``post``) before it fails.
    ``open_timeout``: seconds to open the queue.
    """

    uri: str
    run_id: str | int
    address: str | None = None
    key_column: str | None = None
    serializer: Callable[[Row], bytes] | None = None
    properties_from: Sequence[str] = ()
    session_options: SessionOptions | None = None
    flush_timeout: float = 120.0
    open_timeout: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.properties_from, str):
            # A lone column name would otherwise be read as one column per character.
            object.__setattr__(self, "properties_from", (self.properties_from,))
        else:
            object.__setattr__(self, "properties_from", tuple(self.properties_from))
        if isinstance(self.run_id, bool) or not isinstance(self.run_id, str | int):
            # str(None) would scope every such sink's GUIDs under "None" alike.
            raise InvalidArgumentError(
                f"run_id must be a str or an int, not {type(self.run_id).__name__}"
            )
        if str(self.run_id) == "":
            raise InvalidArgumentError("run_id must not be empty: it scopes the GUIDs")
        named = ([self.key_column] if self.key_column is not None else []) + list(
            self.properties_from
        )
        if any(not isinstance(name, str) or not name.strip() for name in named):
            raise InvalidArgumentError("key_column and properties_from must be column names")
        if not (self.flush_timeout > 0 and self.open_timeout > 0):  # NaN too
            raise InvalidArgumentError("flush_timeout and open_timeout must be > 0")
        if self.address is not None:
            object.__setattr__(self, "address", _checked_address(self.address))

    def __call__(self, rows: Iterable[Row]) -> None:
        """Write one partition (``DataFrame.foreachPartition``); raise if any row is
        not ACKed ``SUCCESS``."""
        self.write_partition(rows)

    def write_batch(self, df: DataFrame, batch_id: int) -> None:
        """Write one micro-batch (``foreachBatch``) under the run id
        ``f"{run_id}/batch/{batch_id}"``."""
        self.check_columns(df.columns)
        df.foreachPartition(self.for_batch(batch_id))

    def check_columns(self, columns: Sequence[str]) -> None:
        """Raise ``InvalidArgumentError`` naming a ``key_column`` or ``properties_from``
        column that is not among ``columns`` (the connector checks its own on the
        driver; this sink sees its columns on the driver only in ``write_batch``, and
        else at a partition's first row)."""
        for option, names in (
            ("key_column", [self.key_column] if self.key_column is not None else []),
            ("properties_from", list(self.properties_from)),
        ):
            for name in names:
                if name not in columns:
                    raise InvalidArgumentError(
                        f"QueueSink {option}: no column {name[:100]!r} "
                        f"(columns: {', '.join(columns)[:300]})"
                    )

    def for_batch(self, batch_id: int) -> QueueSink:
        """This sink with the run id of micro-batch ``batch_id``."""
        return replace(self, run_id=f"{self.run_id}/batch/{batch_id}")

    def write_partition(self, rows: Iterable[Row]) -> SinkResult:
        """Post every row, wait for every ACK, and return what happened; raise
        ``SinkError`` unless every row was ACKed ``SUCCESS``."""
        spec = WriteSpec(
            self.uri,
            self.address,
            self.key_column,
            self.serializer,
            tuple(self.properties_from),
            self.session_options,
            self.flush_timeout,
            self.open_timeout,
        )
        it = iter(rows)
        first = next(it, None)
        if first is not None:
            if hasattr(first, "asDict"):  # a Spark Row: once per partition, not per row
                self.check_columns(list(first.asDict()))
            it = itertools.chain([first], it)
        return post_rows(spec, it, str(self.run_id), task_partition())


def _checked_address(address: object) -> str:
    """``address`` with the default port added where an entry names none, checked
    here on the driver: a bad one would otherwise fail every task on the executors."""
    if not isinstance(address, str):
        raise InvalidArgumentError(f"address is a str, not {type(address).__name__}")
    if not address.strip():
        # Empty would mean the default, which surprises more than it helps (as the
        # connector's option).
        raise InvalidArgumentError("address must not be empty (leave it out for the default)")
    address = with_default_port(address)
    parse_addresses(address)
    return address

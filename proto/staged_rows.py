"""The rows of a ``Staging`` stage call (``StageRows``), as columns.

A Spark task stages thousands of rows per call; one ``Put`` message per row with a
property map cost the task 3.7 us a row to build (more than its JSON and its GUID
together) and the broker as much again to read. The columns: the GUIDs packed, the
payloads end to end with their lengths, a property every row has as one column of
values (the connector's ``x-key``), and any other properties for the rows that have
them. ``read_staged`` also takes the first form (a ``Put`` per row, ``rows``), which
SDKs before the columns send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from holdfast.proto import pb
from holdfast.proto.columns import (
    Malformed,
    add_properties,
    indexed_properties,
    split_guids,
    split_payloads,
)

StagedPut = tuple[bytes, bytes, Mapping[str, str] | None]
"""``(guid, payload, properties)`` of one staged row (properties None or empty: none)."""

_NO_PROPERTIES: Mapping[str, str] = {}


def _shared_name(rows: Sequence[StagedPut]) -> str | None:
    """The name of the one property every row has, and no row has another."""
    first = rows[0][2]
    if not first or len(first) != 1:
        return None
    (name,) = first
    for _, _, properties in rows:
        if not properties or len(properties) != 1 or name not in properties:
            return None
    return name


def stage_rows(partition: int, attempt: int, rows: Sequence[StagedPut]) -> pb.StageRows:
    """A ``StageRows`` carrying ``rows`` as columns."""
    stage = pb.StageRows(
        partition=partition,
        attempt=attempt,
        guids=b"".join([row[0] for row in rows]),
        payloads=b"".join([row[1] for row in rows]),
        payload_lengths=[len(row[1]) for row in rows],
    )
    if not rows:
        return stage
    name = _shared_name(rows)
    if name is not None:
        # Every row has it (_shared_name): the filter only tells the type checker so.
        values = [properties[name] for _, _, properties in rows if properties]
        stage.property_columns.add(name=name, values=values)
    else:
        add_properties(((i, row[2]) for i, row in enumerate(rows) if row[2]), stage)
    return stage


def read_staged(stage: pb.StageRows) -> list[tuple[bytes, bytes, Mapping[str, str]]]:
    """The rows of ``stage`` as ``(guid, payload, properties)``, either form;
    ``Malformed`` if its columns disagree on how many rows there are, or it has both
    forms."""
    if stage.rows:
        if stage.guids or stage.payloads or stage.property_columns or stage.properties:
            raise Malformed("a stage call with rows both as messages and as columns")
        return [(put.guid, put.payload, dict(put.properties)) for put in stage.rows]
    guids = split_guids(stage.guids, "stage call")
    count = len(guids)
    payloads = split_payloads(stage.payloads, stage.payload_lengths, count)
    properties: list[Mapping[str, str]] = [_NO_PROPERTIES] * count
    for index, entries in indexed_properties(stage.properties, count).items():
        properties[index] = entries
    for column in stage.property_columns:
        if len(column.values) != count:
            raise Malformed(
                f"a stage call of {count} rows with {len(column.values)} values of "
                f"property {column.name[:100]!r}"
            )
        name = column.name
        for index, value in enumerate(column.values):
            have = properties[index]
            properties[index] = {name: value} if not have else {**have, name: value}
    return list(zip(guids, payloads, properties, strict=True))


__all__ = ["StagedPut", "read_staged", "stage_rows"]

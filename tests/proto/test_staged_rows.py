"""Rows of a stage call as columns (``holdfast.proto.staged_rows``): round trips, the
shared-property column, the first form (a ``Put`` per row), and calls whose columns
disagree."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from holdfast.proto import pb
from holdfast.proto.columns import Malformed
from holdfast.proto.staged_rows import StagedPut, read_staged, stage_rows

G = [bytes([i]) * 16 for i in range(4)]

names = st.sampled_from(["x-key", "k", "x-ttl-ms"])
properties = st.none() | st.dictionaries(names, st.text(max_size=5), max_size=3)
rows_strategy = st.lists(
    st.tuples(st.binary(min_size=16, max_size=16), st.binary(max_size=20), properties),
    max_size=20,
)


def expected(rows: list[StagedPut]) -> list[tuple[bytes, bytes, Mapping[str, str]]]:
    return [(guid, payload, dict(props or {})) for guid, payload, props in rows]


@given(rows_strategy)
def test_rows_round_trip_through_the_columns(rows: list[StagedPut]) -> None:
    stage = stage_rows(3, 7, rows)
    wire = pb.StageRows.FromString(stage.SerializeToString())
    assert (wire.partition, wire.attempt) == (3, 7)
    assert read_staged(wire) == expected(rows)


def test_a_property_every_row_has_travels_as_one_column() -> None:
    rows: list[StagedPut] = [(G[i], b"p%d" % i, {"x-key": str(i)}) for i in range(3)]
    stage = stage_rows(0, 1, rows)
    assert [(c.name, list(c.values)) for c in stage.property_columns] == [
        ("x-key", ["0", "1", "2"])
    ]
    assert not stage.properties and not stage.rows
    assert stage.guids == b"".join(G[:3]) and list(stage.payload_lengths) == [2, 2, 2]
    assert read_staged(stage) == expected(rows)
    mixed: list[StagedPut] = [(G[0], b"", {"x-key": "0"}), (G[1], b"", {"k": "v"})]
    sparse = stage_rows(0, 1, mixed)
    assert not sparse.property_columns and [p.index for p in sparse.properties] == [0, 1]
    assert read_staged(sparse) == expected(mixed)


def test_the_first_form_a_put_per_row_is_read_too() -> None:
    stage = pb.StageRows(
        rows=[pb.Put(guid=G[0], payload=b"a", properties={"k": "v"}), pb.Put(guid=G[1])]
    )
    assert read_staged(stage) == [(G[0], b"a", {"k": "v"}), (G[1], b"", {})]


@pytest.mark.parametrize(
    "stage",
    [
        pb.StageRows(guids=G[0][:15], payloads=b"", payload_lengths=[0]),
        pb.StageRows(guids=G[0] + G[1], payloads=b"ab", payload_lengths=[2]),
        pb.StageRows(guids=G[0], payloads=b"ab", payload_lengths=[1]),
        pb.StageRows(
            guids=G[0] + G[1],
            payloads=b"ab",
            payload_lengths=[1, 1],
            property_columns=[pb.PropertyColumn(name="x-key", values=["only one"])],
        ),
        pb.StageRows(
            guids=G[0],
            payloads=b"a",
            payload_lengths=[1],
            properties=[pb.IndexedProperties(index=1, entries={"k": "v"})],
        ),
        pb.StageRows(rows=[pb.Put(guid=G[0])], guids=G[1], payloads=b"", payload_lengths=[0]),
    ],
    ids=["short-guid", "fewer-lengths", "lengths-not-the-size", "short-column", "index", "both"],
)
def test_a_call_whose_columns_disagree_is_malformed(stage: pb.StageRows) -> None:
    with pytest.raises(Malformed):
        read_staged(stage)

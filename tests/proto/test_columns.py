"""Columnar batches (``holdfast.proto.columns``): round trips, compact forms, and
batches whose columns disagree."""

from __future__ import annotations

from typing import Any

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import (
    Malformed,
    ack_batch,
    confirm_batch,
    push_batch,
    put_batch,
    read_acks,
    read_confirms,
    read_pushes,
    read_puts,
    read_rejects,
    reject_batch,
)
from holdfast.proto.validate import ACK_STATUSES

G = [bytes([i]) * 16 for i in range(4)]


def test_a_put_batch_round_trips_with_sparse_properties_and_compact_columns() -> None:
    batch = put_batch([3, 3, 3], G[:3], [b"a", b"", b"ccc"], [0, 0, 0], [(1, {"k": "v"})])
    assert list(batch.queue_ids) == [3]  # one handle for all
    assert list(batch.ages_ms) == []  # all 0
    assert batch.payloads == b"accc" and list(batch.payload_lengths) == [1, 0, 3]
    wire = pb.PutBatch.FromString(batch.SerializeToString())
    rows = list(read_puts(wire).rows())
    assert [(r.queue_id, r.guid, r.payload, dict(r.properties), r.age_ms) for r in rows] == [
        (3, G[0], b"a", {}, 0),
        (3, G[1], b"", {"k": "v"}, 0),
        (3, G[2], b"ccc", {}, 0),
    ]
    mixed = read_puts(put_batch([1, 2], G[:2], [b"x", b"y"], [5, 0]))
    assert (list(mixed.queue_ids), list(mixed.ages_ms)) == ([1, 2], [5, 0])


def test_properties_travel_grouped_by_their_keys() -> None:
    """Messages whose properties have the same keys in the same order share a group:
    the keys once, the values message after message; other keys (or another order)
    make another group; a message without properties is in none."""
    posted = [
        (0, {"reply-to": "r1", "kind": "request"}),
        (1, {"reply-to": "r2", "kind": "request"}),
        (3, {"kind": "reply", "reply-to": "r3"}),
        (4, {"reply-to": "r4", "kind": "request"}),
        (5, {"ü": "€"}),
    ]
    batch = put_batch([1] * 6, G[:4] + G[:2], [b""] * 6, [], posted)
    wire = pb.PutBatch.FromString(batch.SerializeToString())
    assert [(list(g.indexes), list(g.keys), list(g.values)) for g in wire.property_groups] == [
        ([0, 1, 4], ["reply-to", "kind"], ["r1", "request", "r2", "request", "r4", "request"]),
        ([3], ["kind", "reply-to"], ["reply", "r3"]),
        ([5], ["ü"], ["€"]),
    ]
    assert read_puts(wire).properties == dict(posted)
    # One GUID twice in one queue is one message PUSHed twice (malformed): two queues.
    pushed = push_batch([1] * 4 + [2] * 2, G[:4] + G[:2], [b""] * 6, [1] * 6, [0] * 6, posted)
    assert [dict(row.properties) for _, row in read_pushes(pushed)] == [
        posted[0][1], posted[1][1], {}, posted[2][1], posted[3][1], posted[4][1]
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("groups", "complaint"),
    [
        ([pb.PropertyGroup(indexes=[1], keys=["k"], values=["v"])], "message 1 of a batch of 1"),
        (
            [
                pb.PropertyGroup(indexes=[0], keys=["k"], values=["v"]),
                pb.PropertyGroup(indexes=[0], keys=["j"], values=["w"]),
            ],
            "two property groups",
        ),
        ([pb.PropertyGroup(indexes=[0, 0], keys=["k"], values=["v", "w"])], "twice in one"),
        ([pb.PropertyGroup(indexes=[0], keys=["k", "k"], values=["v", "w"])], "not distinct"),
        ([pb.PropertyGroup(indexes=[0])], "not distinct"),
        ([pb.PropertyGroup(indexes=[0], keys=["k", "j"], values=["v"])], "with 1 values"),
        ([pb.PropertyGroup(keys=["k"], values=["v"])], "0 messages and 1 keys with 1"),
    ],
)
def test_property_groups_that_do_not_fit_their_batch_are_malformed(
    groups: list[pb.PropertyGroup], complaint: str
) -> None:
    columns: dict[str, Any] = {
        "queue_ids": [1],
        "guids": G[0],
        "payloads": b"a",
        "payload_lengths": [1],
        "property_groups": groups,
    }
    with pytest.raises(Malformed, match=complaint):
        read_puts(pb.PutBatch(**columns))
    with pytest.raises(Malformed, match=complaint):
        read_pushes(pb.PushBatch(**columns))
    # A group that names nobody is read as no properties at all.
    columns["property_groups"] = [pb.PropertyGroup()]
    assert read_puts(pb.PutBatch(**columns)).properties == {}


def test_an_ack_batch_of_all_successes_carries_no_statuses() -> None:
    ok = ack_batch([(1, G[0], pb.STATUS_OK), (1, G[1], pb.STATUS_OK)])
    assert ok.statuses == b"" and len(ok.SerializeToString()) < 2 * 16 + 8
    assert read_acks(ok) == [(1, G[0], pb.STATUS_OK), (1, G[1], pb.STATUS_OK)]
    mixed = ack_batch([(1, G[0], pb.STATUS_OK), (2, G[1], pb.STATUS_CONFLICT)])
    assert mixed.statuses == bytes([pb.STATUS_OK, pb.STATUS_CONFLICT])
    assert read_acks(mixed) == [(1, G[0], pb.STATUS_OK), (2, G[1], pb.STATUS_CONFLICT)]
    assert read_acks(ack_batch([])) == []


@pytest.mark.parametrize("bad", [200, pb.STATUS_UNSPECIFIED, pb.STATUS_VERSION_MISMATCH, 26])
def test_an_ack_batch_with_a_status_no_ack_carries_is_malformed(bad: int) -> None:
    batch = pb.AckBatch(queue_ids=[1], guids=b"".join(G[:3]), statuses=bytes([1, 19, bad]))
    with pytest.raises(Malformed, match=f"ACK 2 of 3 has status .*\\({bad}\\)") as raised:
        read_acks(batch)
    assert raised.value.status == pb.STATUS_MALFORMED_FRAME
    # Every status an ACK does carry is read back as it was sent.
    acks = [(1, G[0], status) for status in sorted(ACK_STATUSES)]
    assert read_acks(ack_batch(acks)) == acks


def test_push_confirm_and_reject_batches_round_trip() -> None:
    pushes = push_batch([4, 4], G[:2], [b"p", b"qq"], [1, 3], [0, 250], [(0, {"a": "b"})])
    assert [(q, tuple(r)) for q, r in read_pushes(pushes)] == [
        (4, (G[0], b"p", {"a": "b"}, 1, 0)),
        (4, (G[1], b"qq", {}, 3, 250)),
    ]
    assert list(push_batch([1], G[:1], [b""], [1], [0]).delivery_counts) == []
    assert read_confirms(confirm_batch([5, 6], G[:2])) == [(5, G[0]), (6, G[1])]
    rejects = [(1, G[0], True, 0), (1, G[1], False, 10)]
    assert read_rejects(reject_batch(rejects)) == rejects
    same = reject_batch([(1, G[0], True, 5), (1, G[1], True, 5)])
    assert (list(same.requeue), list(same.delay_ms)) == ([True], [5])
    assert read_rejects(same) == [(1, G[0], True, 5), (1, G[1], True, 5)]


@pytest.mark.parametrize(
    ("batch", "complaint"),
    [
        (pb.PutBatch(guids=b"x" * 17), "17 bytes"),
        (pb.PutBatch(queue_ids=[1, 2, 3], guids=b"x" * 32, payload_lengths=[0, 0]), "3 queue_ids"),
        (pb.PutBatch(queue_ids=[1], guids=b"x" * 16, payloads=b"ab", payload_lengths=[1]), "sum"),
        (pb.PutBatch(queue_ids=[1], guids=b"x" * 16, payload_lengths=[0, 0]), "2 payload"),
        (pb.PutBatch(queue_ids=[1], guids=b"x" * 16, payload_lengths=[0], ages_ms=[1, 2]), "ages"),
    ],
)
def test_put_batches_whose_columns_disagree_are_malformed(
    batch: pb.PutBatch, complaint: str
) -> None:
    with pytest.raises(Malformed, match=complaint) as raised:
        read_puts(batch)
    assert raised.value.status == pb.STATUS_MALFORMED_FRAME


def test_other_batches_whose_columns_disagree_are_malformed() -> None:
    with pytest.raises(Malformed, match="2 statuses"):
        read_acks(pb.AckBatch(queue_ids=[1], guids=b"x" * 16, statuses=b"\x01\x01"))
    with pytest.raises(Malformed, match="queue_ids"):
        read_confirms(pb.ConfirmBatch(guids=b"x" * 16))
    with pytest.raises(Malformed, match="requeue"):
        read_rejects(pb.RejectBatch(queue_ids=[1], guids=b"x" * 48, requeue=[True, False]))
    with pytest.raises(Malformed, match="delivery_counts"):
        read_pushes(
            pb.PushBatch(
                queue_ids=[1], guids=b"x" * 16, payload_lengths=[0], delivery_counts=[1, 2]
            )
        )


def test_payloads_of_one_size_are_split_like_any_other() -> None:
    same = read_puts(put_batch([1, 1, 1], G[:3], [b"ab", b"cd", b"ef"]))
    assert same.payloads == [b"ab", b"cd", b"ef"] and same.guids == G[:3]
    assert read_puts(put_batch([1, 1], G[:2], [b"", b""])).payloads == [b"", b""]
    with pytest.raises(Malformed, match="sum to 4, not 6"):
        read_puts(
            pb.PutBatch(queue_ids=[1], guids=b"x" * 32, payloads=b"abcdef", payload_lengths=[2, 2])
        )


def test_a_push_batch_that_breaks_the_push_rules_is_malformed() -> None:
    """A delivery count is 1 on first delivery, never 0; one message (handle and GUID)
    is never PUSHed twice in one batch. One GUID in two queues is two messages."""
    zero = push_batch([1, 1], G[:2], [b"a", b"b"], [1, 1], [0, 0])
    zero.delivery_counts[:] = [3, 0]
    with pytest.raises(Malformed, match="PUSH 1 of 2 has delivery count 0"):
        read_pushes(zero)
    with pytest.raises(Malformed, match="carries one message twice"):
        read_pushes(push_batch([1, 2, 1], [G[0], G[0], G[0]], [b""] * 3, [1] * 3, [0] * 3))
    two_queues = push_batch([1, 2], [G[0], G[0]], [b"a", b"b"], [1, 2], [0, 0])
    assert [(q, row.delivery_count) for q, row in read_pushes(two_queues)] == [(1, 1), (2, 2)]

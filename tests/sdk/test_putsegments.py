"""The packed PUT buffer (``holdfast.sdk.putsegments``) behaves as the dict it replaced.

Segments are made tiny here (4 PUTs) so that a few dozen operations roll, freeze and
drop many of them; the model is the old buffer: a dict of GUID -> PUT in post order.
"""

from __future__ import annotations

import random
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from holdfast.proto import pb
from holdfast.sdk import putsegments
from holdfast.sdk.guids import Uuid7Source
from holdfast.sdk.putbuffer import PUT_OVERHEAD, PendingPut, PutBuffer
from holdfast.sdk.segment import Extra
from holdfast.sdk.types import AckStatus
from tests.sdk.fakes import Harness, put_guids, writer


@contextmanager
def tiny_segments(shift: int = 2, byte_cap: int = 1 << 22) -> Iterator[None]:
    """Segments of ``2**shift`` PUTs (and payload bytes up to about ``byte_cap``) for the
    duration of the block."""
    saved = {
        name: getattr(putsegments, name)
        for name in ("SEGMENT_SHIFT", "SEGMENT_PUTS", "SEGMENT_BYTES", "_MASK", "_ONES")
    }
    putsegments.SEGMENT_BYTES = byte_cap
    putsegments.SEGMENT_SHIFT = shift
    putsegments.SEGMENT_PUTS = 1 << shift
    putsegments._MASK = (1 << shift) - 1
    putsegments._ONES = b"\x01" * (1 << shift)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(putsegments, name, value)


def on_ack_a(ack: object) -> None:
    """A callback kept with some PUTs (compared by identity)."""


# An operation: ("post", guid kind, queue id, payload, with extras), ("run", how many,
# shuffled), ("pop", pick),
# ("ack", how many of the oldest), ("hold", pick), ("due",).
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("post"),
            st.sampled_from(["fresh", "fresh", "fresh", "stray", "again"]),
            st.integers(1, 3),
            st.binary(max_size=12),
            st.booleans(),
        ),
        st.tuples(st.just("run"), st.integers(1, 9), st.booleans(), st.integers(0, 3)),
        st.tuples(st.just("pop"), st.integers(0, 1000)),
        st.tuples(st.just("ack"), st.integers(1, 9)),
        st.tuples(st.just("hold"), st.integers(0, 1000)),
        st.tuples(st.just("due")),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.randoms(use_true_random=False), st.booleans(), st.sampled_from([1 << 22, 16]))
def test_the_packed_buffer_matches_the_dict_model(
    ops: list[tuple[Any, ...]], rnd: random.Random, keyed: bool, byte_cap: int
) -> None:
    """Also keyed (a proxy's buffer: every GUID found by the dict, the column unsorted),
    and with segments closed by their payload bytes before their PUT count."""
    source = Uuid7Source()
    model: dict[bytes, PendingPut] = {}
    held: set[bytes] = set()
    reported: list[bytes] = []
    now = 0.0
    with tiny_segments(byte_cap=byte_cap):
        buffer = PutBuffer(keyed)
        for op in ops:
            now += 1.0
            if op[0] == "post":
                _, kind, queue_id, payload, extras = op
                if kind == "fresh":
                    guid = source.next()[1]
                elif kind == "stray":
                    guid = rnd.randbytes(16)
                elif reported:
                    guid = rnd.choice(reported)  # posted again after its outcome
                else:
                    continue
                if guid in model:
                    assert guid in buffer
                    continue
                assert guid not in buffer
                properties = {"k": payload.hex()} if extras else None
                callback = on_ack_a if extras else None
                size = len(payload) + PUT_OVERHEAD + (7 if extras else 0)
                buffer.add(guid, queue_id, payload, properties, callback, now, size)
                model[guid] = (guid, queue_id, payload, properties, callback, now, size)
            elif op[0] == "run":
                # A proxy relaying a client's batch: one queue, every ``every``-th PUT
                # with properties (0: none has any).
                _, n, shuffled, every = op
                run = [source.next()[1] for _ in range(n)]
                if shuffled:
                    rnd.shuffle(run)
                payloads = [bytes([j]) * j for j in range(n)]
                with_properties: dict[int, Extra] = {
                    j: ({"k": str(j)}, None, 9) for j in range(n) if every and j % every == 0
                }
                buffer.segments.extend(run, 2, payloads, [now] * n, with_properties)
                for j, (guid, payload) in enumerate(zip(run, payloads, strict=True)):
                    extra = with_properties.get(j)
                    size = len(payload) + PUT_OVERHEAD + (9 if extra else 0)
                    properties = extra[0] if extra else None
                    model[guid] = (guid, 2, payload, properties, None, now, size)
                    buffer.bytes += size
            elif op[0] == "pop" and model:
                guid = list(model)[op[1] % len(model)]
                assert buffer.pop(guid) == model.pop(guid)
                held.discard(guid)
                reported.append(guid)
                assert buffer.pop(guid) is None
            elif op[0] == "ack":
                # The ACK loop's fast path: the oldest pending, in post order, as one run.
                oldest = list(model)[: op[1]]
                joined = b"".join(oldest)
                segments = buffer.segments
                start = 0
                while start < len(oldest):
                    segment, i, n = segments.match_run(joined, start, len(oldest) - start)
                    if n:
                        segments.release_run(segment, i, n)
                        for guid in oldest[start : start + n]:
                            buffer.bytes -= model.pop(guid)[6]
                        start += n
                    else:
                        assert buffer.pop(oldest[start]) == model.pop(oldest[start])
                        start += 1
                held.difference_update(oldest)
                reported += oldest
            elif op[0] == "hold" and model:
                guid = list(model)[op[1] % len(model)]
                buffer.hold(guid, now)
                held.add(guid)
            elif op[0] == "due":
                due = buffer.take_due(now + 100.0)
                if held:
                    assert due == [put for guid, put in model.items() if guid in held]
                    held.clear()
            assert len(buffer) == len(model)
            assert list(buffer) == list(model.values())
            assert buffer.bytes == sum(put[6] for put in model.values())
            assert buffer.of_queue(2) == [put for put in model.values() if put[1] == 2]
            for guid in reported[-5:]:
                assert (guid in buffer) == (guid in model)


def test_a_segment_is_dropped_once_all_its_puts_are_reported() -> None:
    source = Uuid7Source()
    with tiny_segments():
        buffer = PutBuffer()
        guids = [source.next()[1] for _ in range(10)]
        for guid in guids:
            buffer.add(guid, 1, b"p", None, None, 0.0, 1 + PUT_OVERHEAD)
        assert len(buffer.segments.order) == 3
        for guid in guids[4:8]:
            buffer.pop(guid)
        assert len(buffer.segments.order) == 2  # the middle one went
        for guid in guids[:4] + guids[8:]:
            buffer.pop(guid)
        assert len(buffer) == 0 and buffer.bytes == 0
        assert len(buffer.segments.order) == 1  # a fresh, empty tail


def test_acks_in_and_out_of_order_across_segments_each_report_once() -> None:
    with tiny_segments():
        h = Harness()
        queue_id = writer(h)
        guids = [h.post(queue_id, bytes([n])) for n in range(30)]
        sent = put_guids(h.sent_frames())
        assert sent == guids
        shuffled = guids[10:20]
        random.Random(7).shuffle(shuffled)
        h.ack(*guids[:10])  # in order: runs
        h.ack(*shuffled)  # out of order: one by one
        h.ack(*guids[5:25])  # half of them again: stale
        assert [ack.guid for ack in h.acks] == guids[:10] + shuffled + guids[20:25]
        assert all(ack.status is AckStatus.SUCCESS for ack in h.acks)
        assert h.engine.pending_count == 5
        assert h.engine.stats().buffered_bytes == 5 * (1 + PUT_OVERHEAD)


def test_a_callers_guid_out_of_order_is_found_among_uuid7s() -> None:
    with tiny_segments():
        h = Harness()
        queue_id = writer(h)
        first = h.post(queue_id)
        low = uuid.UUID(int=5)  # below every uuid7: a stray
        h.post(queue_id, b"x", guid=low)
        rest = [h.post(queue_id) for _ in range(6)]
        h.ack(rest[3], low, first, status=pb.STATUS_OK)
        assert [ack.guid for ack in h.acks] == [rest[3], low, first]
        h.ack(*rest)
        assert h.engine.pending_count == 0


def test_a_buffered_put_costs_its_bytes_not_a_tuple_and_a_dict_entry() -> None:
    h = Harness()
    queue_id = writer(h)
    h.lose()  # disconnected: every PUT stays buffered, nothing waits for the wire
    count = 20_000
    filler = bytes(92)
    tracemalloc.start()
    try:
        for n in range(count):  # a payload of its own per PUT, as an application makes them
            h.engine.post(queue_id, n.to_bytes(8, "big") + filler, None, None, h.now, None)
        grown = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert h.engine.pending_count == count
    # Issue #33's target (bench/memory.py measures RSS): 100 payload bytes, 16 of GUID
    # and the offset, time and queue id columns make ~140 B; a tuple, a dict entry and
    # the payload's own bytes object per PUT made ~310 B.
    assert grown / count < 200


def test_an_ack_run_over_a_reported_put_is_not_reported_twice() -> None:
    with tiny_segments(3):
        h = Harness()
        queue_id = writer(h)
        guids = [h.post(queue_id) for _ in range(6)]
        h.ack(guids[1])
        assert h.engine.is_pending(guids[0])  # the search leaves its cursor on guids[1]
        h.ack(guids[1], guids[2], guids[3])  # guids[1] again: a duplicate ACK
        assert [ack.guid for ack in h.acks] == [guids[1], guids[2], guids[3]]
        assert h.engine.stale_acks == 1
        assert h.engine.pending_count == 3


def test_a_keyed_buffer_matches_ack_runs_again_after_an_ack_found_alone() -> None:
    """A proxy's buffer (keyed: its clients' GUIDs interleave) finds an ACK that is not
    at the head of the pending PUTs by its dict; the ACKs that follow it in post order
    then match as one run again, from there. (The search once left the run's start
    behind, so from the first such ACK on a proxy reported every ACK alone.)"""
    segments = putsegments.Segments(keyed=True)
    guids = [bytes([n]) * 16 for n in range(8)]
    segments.extend(guids, 1, [b"x"] * 8, [0.0] * 8)
    found = segments.at(segments.find(guids[2]))  # another frame's ACK came first
    assert found is not None
    segments.release(*found)
    segment, i, n = segments.match_run(b"".join(guids[3:]), 0, 5)
    assert (i, n) == (3, 5)
    segments.release_run(segment, i, n)
    assert segments.count == 2  # guids[0] and guids[1], still pending


def test_puts_taken_out_of_a_full_segment_share_its_bytes() -> None:
    """A proxy sends its whole buffer again after an outage: copying each payload out
    doubled its memory. A full segment's payloads come out as views of its bytes; the
    tail's, whose buffer still grows, as copies (a view would pin it)."""
    source = Uuid7Source()
    with tiny_segments():
        buffer = PutBuffer()
        payloads = [b"payload-%d" % i for i in range(6)]
        for payload in payloads:
            buffer.add(source.next()[1], 1, payload, None, None, 0.0, len(payload) + 64)
        taken = list(buffer)
        assert [put[2] for put in taken] == payloads
        assert [type(put[2]) for put in taken] == [memoryview] * 4 + [bytes] * 2
        buffer.add(source.next()[1], 1, b"more", None, None, 0.0, 68)  # the tail still grows
        assert [bytes(put[2]) for put in buffer][-1] == b"more"


def test_a_segment_of_big_payloads_closes_at_its_byte_cap() -> None:
    """A segment lives while any of its PUTs is pending: 4,096 PUTs of 16 KiB made one
    of 64 MiB, kept whole for its last PUT (a proxy at its bound held several)."""
    source = Uuid7Source()
    payload = bytes(16 << 10)
    cap = putsegments.SEGMENT_BYTES + len(payload)
    posted = PutBuffer()
    for _ in range(1000):
        posted.add(source.next()[1], 1, payload, None, None, 0.0, len(payload) + PUT_OVERHEAD)
    relayed = PutBuffer(True)
    guids = [source.next()[1] for _ in range(1000)]
    relayed.segments.extend(guids, 1, [payload] * 1000, [0.0] * 1000)
    for buffer in (posted, relayed):
        segments = buffer.segments.order
        assert len(segments) >= 4 and max(len(s.data) for s in segments) <= cap
        assert sum(len(s) for s in segments) == 1000 == buffer.segments.count
    assert [put[0] for put in relayed] == guids

"""The uuid7 source behind ``post()``: valid, strictly increasing, true to the clock,
and fresh in a forked child."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
import uuid

import pytest

from holdfast.sdk.guids import Uuid7Source, ack_from_bytes, uuid_from_bytes, uuid_from_int
from holdfast.sdk.types import Ack, AckStatus


def test_guids_are_rfc_9562_version_7_and_match_their_bytes() -> None:
    source = Uuid7Source()
    for _ in range(1000):
        guid, raw = source.next()
        assert guid.version == 7
        assert guid.variant == uuid.RFC_4122
        assert guid.bytes == raw
        assert uuid.UUID(bytes=raw) == guid
        assert hash(uuid.UUID(bytes=raw)) == hash(guid)


def test_guids_strictly_increase_even_many_per_millisecond() -> None:
    source = Uuid7Source()
    guids = [source.next()[0] for _ in range(20_000)]
    assert all(a < b for a, b in itertools.pairwise(guids))


def test_the_timestamp_is_the_real_time_at_any_rate() -> None:
    source = Uuid7Source()
    before = time.time_ns() // 1_000_000
    guids = [source.next()[0] for _ in range(50_000)]
    after = time.time_ns() // 1_000_000
    # Counter bits absorb GUIDs made within one millisecond; the timestamp only
    # borrows the next millisecond after thousands of them.
    assert before <= guids[0].int >> 80
    assert guids[-1].int >> 80 <= after + 1


def test_the_random_part_differs_between_guids() -> None:
    source = Uuid7Source()
    tails = {source.next()[0].int & ((1 << 62) - 1) for _ in range(10_000)}
    assert len(tails) == 10_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_does_not_repeat_the_parents_guids() -> None:
    source = Uuid7Source()
    source.next()  # fill the random pool before the fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next GUIDs and leave at once
        os.close(read_end)
        os.write(write_end, b"".join(source.next()[1] for _ in range(100)))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = b"".join(source.next()[1] for _ in range(100))
    child_tails = {child[i + 8 : i + 16] for i in range(0, len(child), 16)}
    parent_tails = {parent[i + 8 : i + 16] for i in range(0, len(parent), 16)}
    assert len(child_tails) == 100
    assert not child_tails & parent_tails


def test_fast_constructors_equal_the_uuid_constructor() -> None:
    raw = os.urandom(16)
    expected = uuid.UUID(bytes=raw)
    for made in (uuid_from_bytes(raw), uuid_from_int(int.from_bytes(raw))):
        assert made == expected
        assert str(made) == str(expected)
        assert hash(made) == hash(expected)
        assert made.is_safe is uuid.SafeUUID.unknown


def test_the_ack_path_builds_the_same_ack_as_the_constructor() -> None:
    raw = uuid.uuid4().bytes
    made = ack_from_bytes(raw, AckStatus.SUCCESS, "hf://a/b")
    expected = Ack(uuid.UUID(bytes=raw), AckStatus.SUCCESS, "hf://a/b")
    assert made == expected and hash(made) == hash(expected) and repr(made) == repr(expected)
    assert made.guid.bytes == raw and made.guid.is_safe is uuid.SafeUUID.unknown
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.status = AckStatus.UNKNOWN  # type: ignore[misc]

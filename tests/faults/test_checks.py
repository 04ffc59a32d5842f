"""The three checks themselves: each failure they exist for is caught."""

from __future__ import annotations

import uuid

import pytest

from holdfast.sdk import Ack, AckStatus
from tests.faults.checks import assert_exactly_once, copies_in_queue, judge
from tests.support.recorder import AckRecorder


def fixture(count: int = 3) -> tuple[dict[uuid.UUID, bytes], AckRecorder]:
    """``count`` posted PUTs, each ACKed SUCCESS once."""
    posted = {uuid.uuid4(): b"m%d" % i for i in range(count)}
    acks = AckRecorder()
    for guid in posted:
        acks(Ack(guid, AckStatus.SUCCESS, "hf://t/q"))
    return posted, acks


def test_a_clean_run_passes() -> None:
    posted, acks = fixture()
    verdict = assert_exactly_once(posted, acks, list(posted.items()))
    assert verdict.summary().startswith("posted 3: lost 0, duplicated 0, unexpected 0")


def test_a_message_acked_but_missing_from_the_queue_is_lost() -> None:
    posted, acks = fixture()
    missing = next(iter(posted))
    verdict = judge(posted, acks, [(g, p) for g, p in posted.items() if g != missing])
    assert verdict.lost == {missing}
    with pytest.raises(AssertionError, match="lost 1"):
        assert_exactly_once(posted, acks, [(g, p) for g, p in posted.items() if g != missing])


def test_a_message_held_twice_is_duplicated_by_guid_and_by_payload() -> None:
    posted, acks = fixture()
    guid, payload = next(iter(posted.items()))
    verdict = judge(posted, acks, [*posted.items(), (guid, payload)])
    assert verdict.duplicated == {guid: 2, payload: 2}


def test_a_payload_under_another_guid_is_caught() -> None:
    posted, acks = fixture()
    stray = uuid.uuid4()
    payload = next(iter(posted.values()))
    verdict = judge(posted, acks, [*posted.items(), (stray, payload)])
    assert stray in verdict.unexpected
    assert verdict.duplicated == {payload: 2}


def test_acks_other_than_exactly_one_per_put_are_caught() -> None:
    posted, acks = fixture()
    twice, never = list(posted)[:2]
    acks(Ack(twice, AckStatus.SUCCESS, "hf://t/q"))
    with acks.lock:
        acks.acks = [(a, e) for a, e in acks.acks if a.guid != never]
    verdict = judge(posted, acks, list(posted.items()))
    assert verdict.ack_counts == {twice: 2, never: 0}


def test_a_status_the_test_does_not_allow_is_caught() -> None:
    posted, acks = fixture()
    guid = next(iter(posted))
    with acks.lock:
        acks.acks = [
            (Ack(a.guid, AckStatus.UNKNOWN, a.queue_uri) if a.guid == guid else a, e)
            for a, e in acks.acks
        ]
    assert judge(posted, acks, list(posted.items())).refused == {guid: "UNKNOWN"}
    allowed = (AckStatus.SUCCESS, AckStatus.UNKNOWN)
    # UNKNOWN may or may not be in the queue: both are fine when allowed.
    assert judge(posted, acks, list(posted.items()), allowed).ok
    assert judge(posted, acks, [(g, p) for g, p in posted.items() if g != guid], allowed).ok


def test_copies_in_queue_tell_redeliveries_from_duplicates() -> None:
    class Delivery:
        def __init__(self, guid: uuid.UUID, count: int) -> None:
            self.guid, self.payload, self.delivery_count = guid, b"x", count

    guid = uuid.uuid4()
    redelivered = [Delivery(guid, 1), Delivery(guid, 2)]
    duplicated = [Delivery(guid, 1), Delivery(guid, 1)]
    assert copies_in_queue(redelivered) == [(guid, b"x")]
    assert copies_in_queue(duplicated) == [(guid, b"x"), (guid, b"x")]

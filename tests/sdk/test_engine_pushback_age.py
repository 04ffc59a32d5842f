"""A pushed-back PUT's age (rule 3 with rule 4's horizon): ``HISTORY_FULL`` and
``QUEUE_FULL`` say the broker holds no copy of the PUT, so its age starts again at the
push-back; otherwise a burst past the history's bound, retried until the history had
room, reached the window, was refused ``TOO_OLD`` and reported UNKNOWN, never enqueued.
``LIMIT_EXCEEDED`` says nothing of copies: the age runs on."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
from holdfast.sdk.events import StateRestored

from .fakes import Harness, put_guids, puts_in

WINDOW = 300.0


def _posted_then(seconds: float) -> tuple[Harness, uuid.UUID]:
    """An engine with one PUT sent ``seconds`` ago and not answered yet."""
    h = Harness()
    h.establish(window=WINDOW)
    guid = h.post(h.open_active())
    h.sent_frames()
    h.advance(seconds)
    return h, guid


def _retry(h: Harness) -> list[pb.ClientFrame]:
    deadline = h.engine.next_deadline()
    assert deadline is not None
    h.now = deadline
    h.engine.tick(h.now)
    return h.sent_frames()


@pytest.mark.parametrize("status", [pb.STATUS_HISTORY_FULL, pb.STATUS_QUEUE_FULL])
def test_a_put_the_broker_has_no_copy_of_is_retried_with_its_age_from_the_push_back(
    status: pb.Status,
) -> None:
    h, guid = _posted_then(250.0)
    h.ack(guid, status=status)
    [row] = puts_in(_retry(h))
    assert row.guid == guid.bytes
    assert 49 <= row.age_ms <= 50  # the first back-off (ms, truncated), not 250 s


def test_a_put_held_longer_than_the_window_is_retransmitted_after_a_drop() -> None:
    h, guid = _posted_then(200.0)
    h.ack(guid, status=pb.STATUS_HISTORY_FULL)
    h.lose()
    h.advance(200.0)  # 400 s since the post, 200 s since the broker said it has none
    assert put_guids(h.establish(window=WINDOW)) == [guid]
    assert h.statuses(guid) == []
    assert h.events[-1] == StateRestored(retransmitted=1, expired=0)


def test_a_limit_push_back_keeps_the_age_from_the_first_post() -> None:
    h, guid = _posted_then(250.0)
    h.ack(guid, status=pb.STATUS_LIMIT_EXCEEDED)
    [row] = puts_in(_retry(h))
    assert 250_049 <= row.age_ms <= 250_050

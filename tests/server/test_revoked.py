"""Refused CONFIRMs of deliveries the server revoked and told the client of are not
counted against ``--confirm-errors-per-second`` (``holdfast.server.revoked``); each
is forgiven once. The Redis tests (``tests/redis/test_revoked_confirms.py``) show it
with a node that loses its lease, directly and through the proxy."""

from __future__ import annotations

import pytest

from holdfast.proto import pb
from holdfast.server.guard import ServerGuard, SessionLimits
from holdfast.server.revoked import RevokedDeliveries
from tests.server.test_stream_writer import CountingStream, ScriptedContext

pytestmark = pytest.mark.timeout(30)

LIMIT = 2
"""Refused CONFIRMs a second in these tests (the clock stands still: no refill)."""


def guids(*names: str) -> list[bytes]:
    return [name.encode().ljust(16, b".") for name in names]


def stream() -> CountingStream:
    guard = ServerGuard(limits=SessionLimits(confirm_errors_per_second=LIMIT), clock=lambda: 0.0)
    return CountingStream(ScriptedContext([]), "s", 1 << 20, 1 << 20, guard.session(None))


def refused(queue_id: int, names: list[bytes]) -> dict[tuple[pb.Status, int], list[bytes]]:
    return {(pb.STATUS_UNKNOWN_GUID, queue_id): names}


def test_refusals_of_revoked_deliveries_past_the_limit_end_no_session() -> None:
    session = stream()
    revoked = guids("a", "b", "c", "d", "e")
    session.outbox.revoke(1, revoked)
    session.reject_confirms(refused(1, revoked))
    assert not session.ending
    # Each is forgiven once: confirming them again is the client's fault.
    session.reject_confirms(refused(1, revoked))
    assert session.ending


def test_other_refusals_still_count_beside_revoked_ones() -> None:
    session = stream()
    session.outbox.revoke(1, guids("a", "b", "c", "d"))
    # The same GUIDs under another handle, and GUIDs never revoked, count.
    session.reject_confirms(refused(2, guids("a", "b")))
    assert not session.ending
    session.reject_confirms({**refused(1, guids("a", "b", "c")), **refused(3, guids("x"))})
    assert session.ending


def test_a_session_without_revoked_deliveries_is_ended_past_the_limit() -> None:
    session = stream()
    session.reject_confirms(refused(1, guids("a", "b", "c")))
    assert session.ending


def test_revoked_deliveries_are_forgotten_with_their_handle_and_past_the_bound() -> None:
    revoked = RevokedDeliveries(limit=3)
    revoked.add(1, guids("a", "b"))
    revoked.add(2, guids("c", "d"))
    assert len(revoked) == 3  # the oldest, (1, a), went first
    assert revoked.forgive(refused(1, guids("a", "b"))) == 1
    revoked.forget(2)
    assert len(revoked) == 0
    revoked.add(1, guids("e"))
    revoked.clear()
    assert revoked.forgive(refused(1, guids("e"))) == 0

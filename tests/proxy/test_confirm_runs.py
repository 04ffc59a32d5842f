"""``ConfirmRelay.confirm`` on a real upstream engine (``wire_pushes``): a client's
ConfirmBatch goes upstream by runs of one handle where each delivery is the only one
of its GUID and on the current connection, the rest one by one, each CONFIRM getting
the outcome it would get alone."""

from __future__ import annotations

from collections import deque

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import read_confirms
from holdfast.proxy.routes import ClientHandle, deliveries_of, record_deliveries
from holdfast.proxy.settle import ConfirmRelay
from tests.sdk.fakes import Harness

pytestmark = pytest.mark.timeout(10)

G = [bytes([i]) * 16 for i in range(10)]


class Upstream:
    """The proxy's upstream as ``ConfirmRelay`` uses it."""

    def __init__(self, h: Harness) -> None:
        self.engine = h.engine
        self.wakes = 0

    def queued(self) -> None:
        self.wakes += 1


class Setup:
    def __init__(self) -> None:
        self.h = Harness(wire_pushes=True)
        self.h.establish()
        self.handles: dict[int, ClientHandle] = {}
        self.upstream = Upstream(self.h)
        self.relay = ConfirmRelay(self.upstream, self.handles)  # type: ignore[arg-type]

    def handle(self, client_id: int, uri: str, *, read: bool = True) -> ClientHandle:
        upstream_id = self.h.open_active(uri, read=read, write=not read)
        handle = ClientHandle(client_id, uri, read, not read, self.h.engine.queue(upstream_id))
        self.handles[client_id] = handle
        return handle

    def deliver(self, handle: ClientHandle, n: int, *generations: int) -> None:
        for generation in generations or (self.h.generation,):
            record_deliveries(handle.delivered, [G[n]], generation)

    def upstream_confirms(self) -> list[tuple[int, bytes]]:
        frames = self.h.sent_frames()
        return [c for f in frames if f.HasField("confirms") for c in read_confirms(f.confirms)]


@pytest.fixture
def s() -> Setup:
    return Setup()


def test_runs_of_current_deliveries_go_upstream_together(s: Setup) -> None:
    a, b = s.handle(1, "hf://settle/a"), s.handle(2, "hf://settle/b")
    for n in (0, 1, 2):
        s.deliver(a, n)
    s.deliver(b, 3)
    s.deliver(b, 4)
    s.h.sent_frames()
    rejected = s.relay.confirm([(1, G[0]), (1, G[1]), (2, G[3]), (1, G[2])])
    assert rejected == {} and s.upstream.wakes == 1
    up_a, up_b = a.upstream, b.upstream
    assert up_a is not None and up_b is not None
    assert s.upstream_confirms() == [
        (up_a.queue_id, G[0]),
        (up_a.queue_id, G[1]),
        (up_b.queue_id, G[3]),
        (up_a.queue_id, G[2]),
    ]
    assert not a.delivered and list(b.delivered) == [G[4]]
    assert s.h.engine.stats().messages_confirmed == 4


def test_what_a_run_cannot_take_is_settled_alone_with_its_own_outcome(s: Setup) -> None:
    a = s.handle(1, "hf://settle/a")
    s.handle(2, "hf://settle/w", read=False)
    now, old = s.h.generation, s.h.generation - 1
    s.deliver(a, 0)
    s.deliver(a, 1, old, now)  # a stale delivery and its redelivery
    s.deliver(a, 2, old)  # stale only
    s.deliver(a, 3)
    s.h.sent_frames()
    batch = [(1, G[0]), (1, G[1]), (1, G[2]), (1, G[9]), (1, G[3]), (1, G[0])]
    batch += [(2, G[5]), (7, G[6])]
    rejected = s.relay.confirm(batch)
    assert rejected == {
        (pb.STATUS_UNKNOWN_GUID, 1): [G[2], G[9], G[0]],
        (pb.STATUS_NOT_READABLE, 2): [G[5]],
        (pb.STATUS_UNKNOWN_QUEUE, 7): [G[6]],
    }
    # Only G[2] was the proxy's doing (delivered, then its link changed): G[9] was
    # never delivered, G[0] was confirmed already, handles 2 and 7 cannot take it.
    assert s.relay.blameless == 1
    assert a.upstream is not None
    assert s.upstream_confirms() == [(a.upstream.queue_id, G[n]) for n in (0, 1, 3)]
    # G[1]'s redelivery was settled; its stale delivery is left for the client's
    # CONFIRM of it, refused as stale and not counted against the client.
    assert a.delivered == {G[1]: deque((old,))}
    assert s.relay.confirm([(1, G[1])]) == {(pb.STATUS_UNKNOWN_GUID, 1): [G[1]]}
    assert s.relay.blameless == 1 and not a.delivered


def test_a_run_after_the_upstream_link_dropped_is_refused_as_stale(s: Setup) -> None:
    a = s.handle(1, "hf://settle/a")
    s.deliver(a, 0)
    s.deliver(a, 1)
    s.h.lose()
    assert s.relay.confirm([(1, G[0]), (1, G[1])]) == {
        (pb.STATUS_UNKNOWN_GUID, 1): [G[0], G[1]],
    }
    assert s.relay.blameless == 2  # the client could not know: not counted against it
    assert not a.delivered and s.upstream_confirms() == []
    assert s.relay.confirm([(1, G[0])]) == {(pb.STATUS_UNKNOWN_GUID, 1): [G[0]]}
    assert s.relay.blameless == 0  # a second CONFIRM of it is the client's own


def test_stale_rejects_are_blameless_and_unknown_ones_are_not(s: Setup) -> None:
    a = s.handle(1, "hf://settle/a")
    s.deliver(a, 0)
    s.h.lose()
    s.deliver(a, 1)  # a delivery on no link (the upstream is down)
    rejected = s.relay.settle([(1, G[0], None), (1, G[1], None), (1, G[9], None)])
    assert rejected == {(pb.STATUS_UNKNOWN_GUID, 1): [G[0], G[1], G[9]]}
    assert s.relay.blameless == 2


def test_a_run_on_an_upstream_handle_closing_is_refused_as_an_unknown_queue(s: Setup) -> None:
    a = s.handle(1, "hf://settle/a")
    s.deliver(a, 0)
    s.deliver(a, 1)
    assert a.upstream is not None
    s.h.engine.close_queue(a.upstream.queue_id)
    assert s.relay.confirm([(1, G[0]), (1, G[1])]) == {
        (pb.STATUS_UNKNOWN_QUEUE, 1): [G[0], G[1]],
    }
    assert s.relay.blameless == 2
    assert not a.delivered


def test_a_delivery_is_held_as_its_generation_and_a_second_one_makes_a_deque() -> None:
    delivered: dict[bytes, int | deque[int]] = {}
    record_deliveries(delivered, [G[0], G[1]], 4)
    assert delivered == {G[0]: 4, G[1]: 4}
    assert all(type(held) is int for held in delivered.values())
    record_deliveries(delivered, [G[2], G[1]], 5)  # G[1] delivered again, G[2] new
    assert delivered == {G[0]: 4, G[1]: deque((4, 5)), G[2]: 5}
    record_deliveries(delivered, [G[1]], 6)
    assert delivered[G[1]] == deque((4, 5, 6))
    record_deliveries(delivered, [G[3], G[3], G[4]], 7)  # twice in one batch: two
    assert delivered[G[3]] == deque((7, 7)) and delivered[G[4]] == 7


def test_deliveries_of_turns_a_lone_generation_into_the_deque_the_map_holds() -> None:
    delivered: dict[bytes, int | deque[int]] = {G[0]: 3, G[1]: deque((1, 3))}
    held = deliveries_of(delivered, G[0])
    assert held == deque((3,)) and delivered[G[0]] is held
    assert deliveries_of(delivered, G[1]) is delivered[G[1]]
    assert deliveries_of(delivered, G[2]) is None and G[2] not in delivered


def test_a_lone_delivery_held_as_a_deque_is_still_confirmed(s: Setup) -> None:
    a = s.handle(1, "hf://settle/a")
    a.delivered[G[0]] = deque((s.h.generation,))  # left by an earlier stale CONFIRM
    s.h.sent_frames()
    assert s.relay.confirm([(1, G[0])]) == {}
    assert a.upstream is not None
    assert s.upstream_confirms() == [(a.upstream.queue_id, G[0])]
    assert not a.delivered

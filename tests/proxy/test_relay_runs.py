"""``PutRelay`` in one process, on a real upstream engine (``wire_acks``) with a scripted
broker: a frame goes upstream by runs of one queue where it can, PUT by PUT where a PUT
needs judging alone, and each PUT gets the same outcome, route and charge either way."""

from __future__ import annotations

from typing import Any

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import PutColumns, PutRow, ack_batch, put_batch, read_puts
from holdfast.proxy.budget import PUT_BOOKKEEPING_BYTES
from holdfast.proxy.relay import PutRelay
from holdfast.proxy.routes import ClientHandle, Routes
from holdfast.sdk.engine import SessionEngine
from holdfast.sdk.relaying import Relayed
from tests.sdk.fakes import Harness
from tests.support.columns import puts_of

pytestmark = pytest.mark.timeout(10)


class Client:
    """What ``Routes`` hands outcomes to."""

    def __init__(self) -> None:
        self.acks: list[tuple[int, bytes, int]] = []

    def ack(self, queue_id: int, guid: bytes, status: int) -> None:
        self.acks.append((queue_id, guid, status))

    def ack_rows(self, rows: list[tuple[int, bytes, int]]) -> None:
        self.acks += rows


class Upstream:
    """The proxy's upstream as ``PutRelay`` uses it."""

    def __init__(self, engine: SessionEngine) -> None:
        self.engine = engine
        self.wakes = 0

    def queued(self) -> None:
        self.wakes += 1


class Guard:
    """The client's token as ``PutRelay`` asks it: may it write a dead-letter notice
    into this queue? Not into the domain ``closed``."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def check_derived_put(
        self, notify: str, exists: bool | None, session_id: str
    ) -> tuple[pb.Status, str] | None:
        self.asked.append(notify)
        if notify.startswith("hf://closed/"):
            return pb.STATUS_PERMISSION_DENIED, "may not write domain 'closed'"
        return None


class Setup:
    def __init__(self) -> None:
        self.guard = Guard()
        self.h = Harness()
        self.h.engine = SessionEngine(
            client_id="proxy-1",
            on_event=self.h._record_event,
            confirmer=self.h._confirm,
            wire_acks=True,
        )
        self.h.establish()
        self.routes = Routes(10**9)
        self.client = Client()
        self.key = self.routes.register(self.client)  # type: ignore[arg-type]
        self.upstream = Upstream(self.h.engine)
        self.refused: list[tuple[int, bytes, int]] = []
        self.relay = PutRelay(
            self.upstream,  # type: ignore[arg-type]
            self.routes,
            self.key,
            self.guard,  # type: ignore[arg-type]
            "client-1",
            lambda q, g, s: self.refused.append((q, g, s)),
        )
        self.handles: dict[int, ClientHandle] = {}

    def handle(self, client_id: int, uri: str, *, write: bool = True, read: bool = False) -> None:
        upstream_id = self.h.open_active(uri, read=read, write=write)
        handle = ClientHandle(client_id, uri, read, write, self.h.engine.queue(upstream_id))
        self.handles[client_id] = handle

    def send(self, columns: PutColumns) -> int:
        return self.relay.relay(columns, self.handles)

    def upstream_puts(self) -> list[tuple[bytes, bytes, bool]]:
        frames = self.h.sent_frames()
        puts = [p for f in frames if f.WhichOneof("frame") == "puts" for p in puts_of(f.puts)]
        return [(p.guid, p.payload, bool(p.properties)) for p in puts]

    def upstream_puts_with_properties(self) -> list[PutRow]:
        frames = self.h.sent_frames()
        return [p for f in frames if f.WhichOneof("frame") == "puts" for p in puts_of(f.puts)]

    def ack_all(self, guids: list[bytes]) -> None:
        self.h.feed(pb.ServerFrame(acks=ack_batch([(1, g, pb.STATUS_OK) for g in guids])))
        self.routes.on_acks(self.h.engine.take_wire_acks())


def guid(n: int) -> bytes:
    return bytes([n]) * 16


def frame(rows: list[tuple[int, int, bytes]], properties: Any = ()) -> PutColumns:
    """A client's PutBatch of (handle, GUID number, payload) rows, read back."""
    return read_puts(
        put_batch(
            [q for q, _, _ in rows],
            [guid(g) for _, g, _ in rows],
            [p for _, _, p in rows],
            [5] * len(rows),
            properties,
        )
    )


@pytest.fixture
def s() -> Setup:
    setup = Setup()
    setup.handle(1, "hf://relay/a")
    setup.handle(2, "hf://relay/b")
    setup.handle(3, "hf://relay/r", write=False, read=True)
    return setup


def test_runs_of_queues_go_upstream_in_order_with_their_routes_and_charges(s: Setup) -> None:
    rows = [(1, 1, b"a1"), (1, 2, b"a22"), (2, 3, b"b"), (1, 4, b"a4"), (2, 5, b"bbbbb")]
    assert s.send(frame(rows)) == 5
    assert s.upstream.wakes == 1
    assert s.upstream_puts() == [(guid(g), p, False) for _, g, p in rows]
    charges = sum(len(p) + PUT_BOOKKEEPING_BYTES for _, _, p in rows)
    assert s.routes.budget.held(s.key) == charges and len(s.routes) == 5
    s.ack_all([guid(g) for _, g, _ in rows])
    assert s.client.acks == [(q, guid(g), pb.STATUS_OK) for q, g, _ in rows]
    assert s.routes.budget.total == 0 and not s.refused


def test_refused_runs_are_answered_put_by_put_and_the_rest_still_goes(s: Setup) -> None:
    rows = [(9, 1, b"x"), (9, 2, b"y"), (3, 3, b"z"), (1, 4, b"ok"), (1, 5, b"ok too")]
    assert s.send(frame(rows)) == 2
    assert s.refused == [
        (9, guid(1), pb.STATUS_UNKNOWN_QUEUE),
        (9, guid(2), pb.STATUS_UNKNOWN_QUEUE),
        (3, guid(3), pb.STATUS_NOT_WRITABLE),
    ]
    assert [g for g, _, _ in s.upstream_puts()] == [guid(4), guid(5)]
    assert s.routes.budget.held(s.key) == 8 + 2 * PUT_BOOKKEEPING_BYTES


def test_a_guid_twice_in_a_frame_is_one_put_upstream_and_two_acks(s: Setup) -> None:
    rows = [(1, 1, b"same"), (1, 2, b"other"), (1, 1, b"same")]
    assert s.send(frame(rows)) == 3
    assert s.upstream_puts() == [(guid(1), b"same", False), (guid(2), b"other", False)]
    assert s.routes.budget.held(s.key) == 9 + 2 * PUT_BOOKKEEPING_BYTES  # the join is free
    s.ack_all([guid(1), guid(2)])
    assert s.client.acks == [(1, guid(g), pb.STATUS_OK) for g in (1, 1, 2)]
    assert s.routes.budget.total == 0


def test_a_pending_guid_in_a_run_is_judged_alone_and_the_run_still_goes(s: Setup) -> None:
    assert s.send(frame([(1, 1, b"first")])) == 1
    rows = [(1, 2, b"new"), (1, 1, b"changed"), (2, 1, b"elsewhere")]
    assert s.send(frame(rows)) == 1
    assert s.refused == [(1, guid(1), pb.STATUS_CONFLICT)]  # the other queue's is parked
    assert [g for g, _, _ in s.upstream_puts()] == [guid(1), guid(2)]
    s.routes.relay = s.h.engine.relay
    s.ack_all([guid(1)])
    assert s.upstream_puts() == [(guid(1), b"elsewhere", False)]


def never_one_by_one(*args: object, **kwargs: object) -> Relayed:
    raise AssertionError("a PUT was relayed alone")


def test_runs_with_properties_go_upstream_whole_with_each_puts_own(s: Setup) -> None:
    """Properties do not make a frame go PUT by PUT: each run of a queue goes in one
    call, every PUT keeps its own properties upstream and is charged for them (their
    characters), also in a run that starts inside the frame."""
    s.h.engine.relay = never_one_by_one
    rows = [(1, 1, b"plain"), (1, 2, b"with"), (2, 3, b"b"), (2, 4, b"bb"), (1, 5, b"a")]
    posted = {1: {"k": "v"}, 3: {"k": "w", "kk": "x"}, 4: {"kk": "y", "k": "z"}}
    assert s.send(frame(rows, posted.items())) == 5
    sent = [(p.guid, dict(p.properties)) for p in s.upstream_puts_with_properties()]
    assert sent == [(guid(g), posted.get(i, {})) for i, (_, g, _) in enumerate(rows)]
    payloads = sum(len(p) for _, _, p in rows)
    assert s.routes.budget.held(s.key) == payloads + 5 * PUT_BOOKKEEPING_BYTES + 2 + 5 + 5
    s.ack_all([guid(g) for _, g, _ in rows])
    assert s.client.acks == [(q, guid(g), pb.STATUS_OK) for q, g, _ in rows]
    assert s.routes.budget.total == 0 and not s.refused


def test_dead_letter_notices_are_checked_once_a_queue_and_a_refused_one_alone(
    s: Setup,
) -> None:
    """A run whose PUTs name dead-letter notices (a request/reply caller's requests, all
    naming its reply queue) goes whole once the token may write each queue named, each
    asked once; a notice it may not write is refused PERMISSION_DENIED for its PUT
    alone, and the other PUTs of the run still go."""
    relay, s.h.engine.relay = s.h.engine.relay, never_one_by_one
    mine = {"x-dead-letter-notify": "hf://open/replies", "x-ttl-ms": "1000"}
    rows = [(1, 1, b"r1"), (1, 2, b"r2"), (1, 3, b"r3")]
    assert s.send(frame(rows, [(0, mine), (1, mine), (2, mine)])) == 3
    assert s.guard.asked == ["hf://open/replies"] and not s.refused
    s.h.engine.relay = relay
    s.guard.asked.clear()
    theirs = {"x-dead-letter-notify": "hf://closed/replies"}
    rows = [(1, 4, b"r4"), (1, 5, b"r5"), (1, 6, b"r6")]
    assert s.send(frame(rows, [(0, mine), (1, theirs), (2, mine)])) == 2
    assert s.refused == [(1, guid(5), pb.STATUS_PERMISSION_DENIED)]
    sent = [p.guid for p in s.upstream_puts_with_properties()]
    assert sent == [guid(g) for g in (1, 2, 3, 4, 6)]


def test_a_run_with_properties_over_the_limits_is_judged_put_by_put(s: Setup) -> None:
    """A PUT whose properties break the limits (an invalid pickup TTL, too many) makes
    its run go PUT by PUT: it is refused INVALID_PROPERTIES, the others still go."""
    too_many = {f"k{i}": "v" for i in range(s.h.engine.limits.max_properties + 1)}
    rows = [(1, 1, b"ok"), (1, 2, b"bad ttl"), (1, 3, b"too many"), (1, 4, b"fine")]
    posted = [(0, {"a": "b"}), (1, {"x-ttl-ms": "soon"}), (2, too_many), (3, {"a": "c"})]
    assert s.send(frame(rows, posted)) == 2
    assert s.refused == [
        (1, guid(2), pb.STATUS_INVALID_PROPERTIES),
        (1, guid(3), pb.STATUS_INVALID_PROPERTIES),
    ]
    sent = [(p.guid, dict(p.properties)) for p in s.upstream_puts_with_properties()]
    assert sent == [(guid(1), {"a": "b"}), (guid(4), {"a": "c"})]
    assert s.routes.budget.held(s.key) == 2 + 4 + 2 * PUT_BOOKKEEPING_BYTES + 2 + 2


def test_a_run_of_guids_routed_for_a_departed_client_moves_their_charges(s: Setup) -> None:
    routes, budget = s.routes, s.routes.budget
    gone = routes.register(Client())  # type: ignore[arg-type]
    budget.charge(gone, 100)
    routes.add(guid(1), gone, 7, 100)
    routes.unregister(gone)
    charge = 3 + 2 + 2 * PUT_BOOKKEEPING_BYTES
    budget.charge(s.key, charge)  # as ``PutRelay`` does before it adds the routes
    routes.add_run(
        [guid(1), guid(2)], s.key, 1, [3 + PUT_BOOKKEEPING_BYTES, 2 + PUT_BOOKKEEPING_BYTES]
    )
    assert budget.held(gone) == 0 and budget.held(s.key) == 100 + charge
    routes.on_acks([(guid(1), pb.STATUS_OK)])
    assert budget.held(s.key) == 2 + PUT_BOOKKEEPING_BYTES
    routes.on_acks([(guid(2), pb.STATUS_OK)])
    assert s.client.acks == [(1, guid(1), pb.STATUS_OK), (1, guid(2), pb.STATUS_OK)]
    assert budget.total == 0


def test_acks_go_back_by_runs_of_one_client_in_order_with_their_charges() -> None:
    routes = Routes(10**6)
    budget = routes.budget
    a, b, c = Client(), Client(), Client()
    ka, kb, kc = (routes.register(x) for x in (a, b, c))  # type: ignore[arg-type]
    for n, key, queue_id, charge in [
        (1, ka, 1, 10), (2, ka, 1, 20), (3, kb, 2, 30), (4, ka, 1, 0), (5, kc, 1, 50),
        (6, kb, 2, 60),
    ]:  # fmt: skip
        budget.charge(key, charge)
        routes.add(guid(n), key, queue_id, charge)
    routes.add(guid(6), ka, 5)  # A posted 6 too, while B's was pending
    routes.unregister(kc)
    acks = [(guid(n), pb.STATUS_OK) for n in (1, 2, 3, 6, 4, 5, 9)]
    acks[1] = (guid(2), pb.STATUS_CONFLICT)
    routes.on_acks(acks)
    assert a.acks == [
        (1, guid(1), pb.STATUS_OK),
        (1, guid(2), pb.STATUS_CONFLICT),
        (5, guid(6), pb.STATUS_OK),
        (1, guid(4), pb.STATUS_OK),
    ]
    assert b.acks == [(2, guid(3), pb.STATUS_OK), (2, guid(6), pb.STATUS_OK)]
    assert c.acks == [] and budget.total == 0 and len(routes) == 0

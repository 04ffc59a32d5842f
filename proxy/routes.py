"""What the proxy keeps for routing: client handles, ACK routes by GUID, counters.

``Routes`` maps each GUID pending upstream to the client session (and queue handle)
that posted it, so the upstream engine's PUT outcomes, relayed as (GUID, wire
status) pairs, reach the right client (``holdfast.proxy.client``); a
``ClientHandle`` is one queue handle a client opened, with the upstream handle it
rides on and the deliveries it holds.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING

from holdfast.proto import pb
from holdfast.proxy.budget import (
    DEFAULT_MAX_BUFFER_BYTES,
    BufferBudget,
)
from holdfast.sdk.engine import QueueRecord, WireAck, WirePushes
from holdfast.sdk.relaying import Relayed
from holdfast.server.outbox import AckEntry

if TYPE_CHECKING:
    from holdfast.proxy.client import ClientSession


class ProxyCounters:
    """Plain counters the proxy's hot paths bump (read at scrape time)."""

    __slots__ = ("acks", "puts_relayed", "reconnects")

    def __init__(self) -> None:
        self.puts_relayed = 0
        self.acks: Counter[int] = Counter()
        """ACKs sent to clients, by status."""
        self.reconnects = 0


@dataclass(eq=False)
class ClientHandle:
    """A queue handle of one client, and the upstream handle it maps to."""

    queue_id: int
    uri: str
    read: bool
    write: bool
    upstream: QueueRecord | None = None
    """None until the upstream open completes."""
    early: list[WirePushes] = field(default_factory=list)
    """PUSHes that arrived before the client was told the handle is open: a client
    drops PUSHes for a handle it does not know to be open, so they wait here."""
    delivered: dict[bytes, int | deque[int]] = field(default_factory=dict)
    """Deliveries PUSHed to this client and not yet confirmed, by GUID: the upstream
    connection generation each was delivered on, oldest first. One delivery (the usual
    case) is held as its generation alone: a deque per message cost 760 B and a third
    of the relay's work per PUSH; a GUID delivered again before its CONFIRM (after an
    upstream reconnect the client may hold the stale delivery and the redelivery)
    holds a deque. ``record_deliveries`` and ``deliveries_of`` keep the two forms."""


def record_deliveries(
    delivered: dict[bytes, int | deque[int]], guids: list[bytes], generation: int
) -> None:
    """Add the deliveries of ``guids`` on upstream connection ``generation`` to a
    handle's ``delivered``. GUIDs not held yet (nearly always all of them) join in one
    C loop; one held already gets a deque of its deliveries, oldest first."""
    before = len(delivered)
    if delivered.keys().isdisjoint(guids):
        delivered.update(zip(guids, repeat(generation)))
        if len(delivered) - before == len(guids):
            return
        # A GUID twice in one batch (a broker never does it): a delivery each.
        for guid, times in Counter(guids).items():
            if times > 1:
                delivered[guid] = deque(repeat(generation, times))
        return
    for guid in guids:
        held = delivered.get(guid)
        if held is None:
            delivered[guid] = generation
        elif isinstance(held, int):
            delivered[guid] = deque((held, generation))
        else:
            held.append(generation)


def deliveries_of(delivered: dict[bytes, int | deque[int]], guid: bytes) -> deque[int] | None:
    """The deliveries of ``guid`` held in ``delivered``, oldest first, as a deque held
    in the map (a lone generation becomes one), or None."""
    held = delivered.get(guid)
    if held is None or not isinstance(held, int):
        return held
    deliveries = delivered[guid] = deque((held,))
    return deliveries


@dataclass(frozen=True, slots=True)
class ParkedPut:
    """A client's PUT of a GUID that is pending upstream on another queue: another
    message, relayed once the pending one has its outcome (``Relayed.BUSY``)."""

    client_key: int
    queue_id: int
    """The client's handle."""
    upstream_queue_id: int
    payload: bytes
    properties: Mapping[str, str] | None
    guid: bytes
    arrived: float
    """Monotonic time it arrived: with ``age_ms``, its age keeps running while parked."""
    age_ms: int
    charge: int
    """Bytes charged to the client for it (``BufferBudget``) while it is held here."""

    @property
    def relay_args(self) -> tuple[int, bytes, Mapping[str, str] | None, bytes, float, int]:
        """The arguments of ``SessionEngine.relay`` for this PUT."""
        return (
            self.upstream_queue_id,
            self.payload,
            self.properties,
            self.guid,
            self.arrived,
            self.age_ms,
        )


Relay = Callable[[int, bytes, "Mapping[str, str] | None", bytes, float, int], Relayed]
"""``SessionEngine.relay``."""


class Routes:
    """Which client stream each pending PUT's ACK goes back to, by GUID.

    A route is ``(client key, queue_id, charge)``: ints, not the client object, so
    the garbage collector does not track the tuple. With 200k PUTs in flight, routes
    holding the client made full collections walk every one of them, about 40% of
    the proxy's CPU at full rate. ``charge`` is what the PUT's client was charged in
    ``budget``, released with its outcome.
    """

    def __init__(self, max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES) -> None:
        self.budget = BufferBudget(max_buffer_bytes)
        """The proxy's buffer bound, per client (``holdfast.proxy.budget``)."""
        self._by_guid: dict[bytes, tuple[int, int, int]] = {}
        self._also: dict[bytes, list[tuple[int, int]]] = {}
        """Further live clients waiting on the same GUID (rare: e.g. a speculative Spark
        task posting the rows of another attempt that is still running)."""
        self._clients: dict[int, ClientSession] = {}
        self._next_key = 1
        self._parked: dict[bytes, list[ParkedPut]] = {}
        self.relay: Relay | None = None
        """The upstream engine's ``relay``, for parked PUTs (set by the proxy server)."""
        self.relayed: Callable[[], None] = lambda: None
        """Wakes the upstream writer after parked PUTs were relayed."""

    def register(self, client: ClientSession) -> int:
        """Make ``client`` routable; return its key (never reused)."""
        key = self._next_key
        self._next_key += 1
        self._clients[key] = client
        self.budget.connect(key)
        return key

    def unregister(self, key: int) -> None:
        """The client left: its routes lead nowhere now (its ACKs are dropped, as it
        could not receive them; the PUTs stay pending upstream)."""
        self._clients.pop(key, None)
        self.budget.disconnect(key)

    def add(self, guid: bytes, client_key: int, queue_id: int, charge: int = 0) -> None:
        """Route the ACK of ``guid`` to the client's handle ``queue_id`` too.

        A route of a client that has gone is replaced (a client retransmitting after
        it reconnected); one of a live client is kept, so each PUT gets its one ACK: a
        live client that PUT the GUID twice (twice in one PutBatch, say) gets two, as
        it does from a broker.

        ``charge`` is what the client was charged for the PUT (0 if it joined a PUT
        pending already); a replaced route's charge moves to the new client, which now
        answers for that buffered PUT."""
        current = self._by_guid.get(guid)
        if current is None:
            self._by_guid[guid] = (client_key, queue_id, charge)
        elif current[0] not in self._clients:
            moved = current[2]
            if moved:
                budget = self.budget
                budget.release(current[0], moved)
                budget.charge(client_key, moved)
            self._by_guid[guid] = (client_key, queue_id, moved + charge)
        else:
            self._also.setdefault(guid, []).append((client_key, queue_id))

    def add_run(
        self, guids: Sequence[bytes], client_key: int, queue_id: int, charges: Sequence[int]
    ) -> None:
        """``add`` for a run of PUTs that the upstream engine has just buffered, each
        charged what ``charges`` says (in order)."""
        by_guid = self._by_guid
        if not by_guid.keys().isdisjoint(guids):
            # A route left by a client that has gone, say: ``add`` decides each.
            for guid, charge in zip(guids, charges, strict=True):
                self.add(guid, client_key, queue_id, charge)
            return
        first = charges[0] if charges else 0
        if charges.count(first) == len(charges):
            # PUTs of one size (the usual producer) share one route tuple.
            by_guid.update(zip(guids, repeat((client_key, queue_id, first))))
        else:
            by_guid.update(
                zip(
                    guids,
                    [(client_key, queue_id, charge) for charge in charges],
                    strict=True,
                )
            )

    def fresh(self, guids: Sequence[bytes]) -> list[int]:
        """The indices of ``guids`` not pending upstream already."""
        by_guid = self._by_guid
        return [i for i, guid in enumerate(guids) if guid not in by_guid]

    def park(self, put: ParkedPut) -> None:
        """Keep ``put`` until its GUID's pending PUT (on another queue) has an outcome
        (the caller has charged ``put.charge`` to its client)."""
        self._parked.setdefault(put.guid, []).append(put)

    def _unpark(self, guid: bytes) -> None:
        """The pending PUT of ``guid`` has its outcome: relay what waited for it."""
        waiting = self._parked.pop(guid, [])
        relay = self.relay
        assert relay is not None, "Routes.relay is set before any client connects"
        budget = self.budget
        sent = False
        for put in waiting:
            client = self._clients.get(put.client_key)
            if client is None:
                # The client left: it retransmits after it reconnects.
                budget.release(put.client_key, put.charge)
                continue
            outcome = relay(*put.relay_args)
            if outcome is Relayed.BUSY:
                self.park(put)
            elif outcome is Relayed.SENT:
                self.add(guid, put.client_key, put.queue_id, put.charge)
                sent = True
            else:
                budget.release(put.client_key, put.charge)
                if outcome is Relayed.CONFLICT:
                    client.ack(put.queue_id, guid, pb.STATUS_CONFLICT)
                else:
                    self.add(guid, put.client_key, put.queue_id)
                    sent = True
        if sent:
            self.relayed()

    def on_acks(self, acks: list[WireAck]) -> None:
        """Deliver upstream outcomes to the clients that posted the PUTs, if still there,
        then relay the PUTs that waited for those GUIDs.

        The ACKs of one client's PUTs come in runs (the whole batch, usually): each run
        is handed over as one list, its charges released in one sum."""
        pop = self._by_guid.pop
        also = self._also
        rows: list[AckEntry] = []
        key = -1
        freed = 0
        for guid, status in acks:
            route = pop(guid, None)
            if route is None:
                continue
            if route[0] != key:
                if rows:
                    self._hand_over(key, rows, freed)
                    rows = []
                key = route[0]
                freed = 0
            freed += route[2]
            rows.append((route[1], guid, status))
            if also and guid in also:
                # The other clients of this GUID hear of it in order with the rest.
                self._hand_over(key, rows, freed)
                rows, freed = [], 0
                clients = self._clients
                for other_key, queue_id in also.pop(guid):
                    other = clients.get(other_key)
                    if other is not None:
                        other.ack(queue_id, guid, status)
        if rows:
            self._hand_over(key, rows, freed)
        if self._parked:
            for guid, _ in acks:
                if guid in self._parked:
                    self._unpark(guid)
        self.budget.wake()

    def _hand_over(self, key: int, rows: list[AckEntry], freed: int) -> None:
        """Release ``freed`` bytes of client ``key`` and give it ``rows``, if it is here."""
        if freed:
            self.budget.release(key, freed)
        client = self._clients.get(key)
        if client is not None:
            client.ack_rows(rows)

    def __len__(self) -> int:
        return len(self._by_guid)

"""A client's PUTs, posted upstream under the client's GUIDs.

Each PUT keeps its GUID and age upstream (so the broker's dedup works end to end and no
hop restarts the age). A PUT the proxy can judge itself is answered at once with a typed
ACK: a handle that is not open or not writable, a
dead-letter notice or an ``x-original-uri`` (where a ``dlq replay`` would write the
message) in a domain the client's token may not write. A GUID pending
upstream already is judged by queue and content, as the broker would judge it
(``Relayed``): the same PUT joins it, other content is a CONFLICT, another queue waits
in ``Routes`` until the pending PUT has its outcome.

Each PUT the proxy buffers is charged to its client in ``Routes.budget`` (payload,
properties and the proxy's bookkeeping), and released with its outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from itertools import groupby

from holdfast.proto import pb
from holdfast.proto.columns import Malformed, PutColumns, split_guids
from holdfast.proto.policy import DEAD_LETTER_NOTIFY, ORIGINAL_URI
from holdfast.proxy.budget import PUT_BOOKKEEPING_BYTES
from holdfast.proxy.routes import ClientHandle, ParkedPut, Routes
from holdfast.proxy.upstream import Upstream
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.relaying import Relayed
from holdfast.sdk.statuses import relay_status
from holdfast.server.guard import SessionGuard


class PutRelay:
    """Relays one client's PUTs onto the proxy's upstream session."""

    def __init__(
        self,
        upstream: Upstream,
        routes: Routes,
        route_key: int,
        guard: SessionGuard,
        session_id: str,
        ack: Callable[[int, bytes, pb.Status], None],
    ) -> None:
        self._upstream = upstream
        self._routes = routes
        self._route_key = route_key
        self._guard = guard
        self._session_id = session_id
        self._ack = ack

    def relay(self, puts: PutColumns, handles: Mapping[int, ClientHandle]) -> int:
        """Relay a frame's PUTs, ACK the refused ones; returns how many went upstream.

        A frame goes by runs of one queue (``_relay_run``: one call into the engine, one
        route insertion, one budget charge per run); a run the engine will not take
        whole, or one naming a queue the client's token may not write (a dead-letter
        notice, an ``x-original-uri``), PUT by PUT (``_relay_each``), with the same
        outcome for every PUT."""
        now = time.monotonic()
        relayed = charged = start = 0
        for queue_id, run in groupby(puts.queue_ids):
            end = start + len(list(run))
            done, charge = self._relay_run(puts, handles, queue_id, start, end, now)
            relayed += done
            charged += charge
            start = end
        if relayed:
            self._upstream.queued()
        if charged:
            self._routes.budget.read(self._route_key, charged)
        return relayed

    def refuses(self, batch: pb.PutBatch, wire_bytes: int) -> bool:
        """Whether a PutBatch does not fit the proxy's bound and its slack
        (``BufferBudget.admits``): then each of its PUTs has been answered
        ``LIMIT_EXCEEDED`` (the client keeps them and sends them again, as after a
        broker's push-back) and nothing of it is buffered. Judged before its payloads
        are split, so a refused frame leaves no small objects behind; ``wire_bytes``,
        the size of the client frame it came in, stands for its payloads and
        properties until the bound is near (measuring the batch itself costs a copy)."""
        budget = self._routes.budget
        room = budget.max_bytes + budget.slack - budget.total
        bookkeeping = PUT_BOOKKEEPING_BYTES * len(batch.payload_lengths)
        if not budget.total or wire_bytes + bookkeeping <= room:
            return False
        charge = batch.ByteSize() + bookkeeping
        if charge <= room:
            return False
        try:
            guids = split_guids(batch.guids, "PUT batch")
        except Malformed:
            return False  # answered MALFORMED_FRAME when it is read
        queue_ids = batch.queue_ids
        if len(queue_ids) not in (1, len(guids)):
            return False
        # PUTs the client sends again after it lost the proxy join those buffered
        # already, uncharged; the bookkeeping of the rest is what it would cost.
        fresh = len(self._routes.fresh(guids))
        if fresh < len(guids):
            charge = charge * fresh // max(1, len(guids))
        if budget.admits(self._route_key, charge):
            return False
        ack = self._ack
        ids = list(queue_ids) if len(queue_ids) == len(guids) else [queue_ids[0]] * len(guids)
        for queue_id, guid in zip(ids, guids, strict=True):
            ack(queue_id, guid, pb.STATUS_LIMIT_EXCEEDED)
        return True

    def _relay_run(
        self,
        puts: PutColumns,
        handles: Mapping[int, ClientHandle],
        queue_id: int,
        start: int,
        end: int,
        now: float,
    ) -> tuple[int, int]:
        """Relay PUTs ``start:end`` of one queue: (relayed, charged)."""
        handle = handles.get(queue_id)
        if handle is None or handle.upstream is None or not handle.write:
            return self._relay_each(puts, handles, range(start, end), now)
        properties = puts.properties
        if start == 0 and end == len(puts.guids):
            guids, payloads, ages_ms = puts.guids, puts.payloads, puts.ages_ms
        else:
            guids, payloads = puts.guids[start:end], puts.payloads[start:end]
            ages_ms = puts.ages_ms[start:end]
            if properties:  # by index in the run
                properties = {i - start: p for i, p in properties.items() if start <= i < end}
        if properties and self._refuses_a_named_queue(properties):
            return self._relay_each(puts, handles, range(start, end), now)
        try:
            whole = self._upstream.engine.relay_run(
                handle.upstream.queue_id, guids, payloads, ages_ms, now, properties
            )
        except HoldfastError:
            whole = False  # each PUT is refused with the error's status below
        if not whole:
            return self._relay_each(puts, handles, range(start, end), now)
        charges = [len(payload) + PUT_BOOKKEEPING_BYTES for payload in payloads]
        for index, entries in properties.items():
            charges[index] += _charge(entries)
        charge = sum(charges)
        self._routes.budget.charge(self._route_key, charge)
        self._routes.add_run(guids, self._route_key, queue_id, charges)
        return len(guids), charge

    def _refuses_a_named_queue(self, properties: Mapping[int, Mapping[str, str]]) -> bool:
        """Whether the client's token refuses a dead-letter notice or an
        ``x-original-uri`` some PUT of a run names (each queue named is checked once: a
        request/reply caller's requests all name its reply queue); ``_relay_each`` then
        says which."""
        notices = {p[DEAD_LETTER_NOTIFY] for p in properties.values() if DEAD_LETTER_NOTIFY in p}
        origins = {p[ORIGINAL_URI] for p in properties.values() if ORIGINAL_URI in p}
        guard = self._guard
        return any(
            guard.check_derived_put(notify, None, self._session_id) is not None
            for notify in notices
        ) or any(guard.check_original_uri(origin) is not None for origin in origins)

    def _relay_each(
        self,
        puts: PutColumns,
        handles: Mapping[int, ClientHandle],
        indices: range,
        now: float,
    ) -> tuple[int, int]:
        """Relay the PUTs at ``indices`` one by one: (relayed, charged)."""
        relay = self._upstream.engine.relay
        add_route = self._routes.add
        budget = self._routes.budget
        key = self._route_key
        charged = 0
        handle: ClientHandle | None = None
        last_id = -1
        relayed = 0
        all_properties = puts.properties
        no_properties: Mapping[str, str] = {}
        queue_ids, guids, payloads, ages = puts.queue_ids, puts.guids, puts.payloads, puts.ages_ms
        for index in indices:
            queue_id, guid, payload, age_ms = (
                queue_ids[index], guids[index], payloads[index], ages[index]
            )  # fmt: skip
            put_properties = (
                all_properties.get(index, no_properties) if all_properties else no_properties
            )
            if queue_id != last_id:
                handle = handles.get(queue_id)
                last_id = queue_id
            status: pb.Status | None = None
            if handle is None or handle.upstream is None:
                status = pb.STATUS_UNKNOWN_QUEUE
            elif not handle.write:
                status = pb.STATUS_NOT_WRITABLE
            elif put_properties and DEAD_LETTER_NOTIFY in put_properties:
                # The broker writes the notice with the proxy's token: the client's own
                # must allow it (the broker counts the queue it may create).
                notify = put_properties[DEAD_LETTER_NOTIFY]
                refusal = self._guard.check_derived_put(notify, None, self._session_id)
                status = refusal[0] if refusal is not None else None
            if status is None and put_properties and ORIGINAL_URI in put_properties:
                # A replay of the dead-letter queue would write it there.
                refusal = self._guard.check_original_uri(put_properties[ORIGINAL_URI])
                status = refusal[0] if refusal is not None else None
            if status is None:
                assert handle is not None and handle.upstream is not None
                upstream_id = handle.upstream.queue_id
                properties = put_properties or None
                charge = len(payload) + PUT_BOOKKEEPING_BYTES
                if properties:
                    charge += _charge(properties)
                try:
                    outcome = relay(upstream_id, payload, properties, guid, now, age_ms)
                except HoldfastError as error:
                    status = relay_status(error, pb.STATUS_UNKNOWN_QUEUE)[0]
                else:
                    if outcome is Relayed.CONFLICT:
                        status = pb.STATUS_CONFLICT
                    elif outcome is Relayed.BUSY:
                        budget.charge(key, charge)
                        charged += charge
                        self._routes.park(
                            ParkedPut(
                                key, queue_id, upstream_id, payload, properties,
                                guid, now, age_ms, charge,
                            )
                        )  # fmt: skip
                        continue
                    else:
                        if outcome is Relayed.SENT:
                            budget.charge(key, charge)
                            charged += charge
                        else:
                            charge = 0  # joined a PUT buffered already
                        add_route(guid, key, queue_id, charge)
                        relayed += 1
                        continue
            self._ack(queue_id, guid, status)
        return relayed, charged


def _charge(properties: Mapping[str, str]) -> int:
    """What a PUT's properties add to its charge: their characters."""
    return sum(map(len, properties)) + sum(map(len, properties.values()))


__all__ = ["PutRelay"]

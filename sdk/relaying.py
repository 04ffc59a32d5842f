"""A proxy's clients' PUTs, buffered by the upstream engine under the clients' GUIDs.

The proxy's upstream session is an SDK engine like any other (rules 2 and 4 hold for
it), but its PUTs come with GUIDs, ages and properties already: ``Relayer.relay`` is
``post()`` for one such PUT, ``Relayer.relay_run`` for a run of one queue's PUTs of a
client's batch, checked once and buffered column by column. Both back-date a PUT by the
age it arrived with, so this hop never restarts it (rule 10), and give the broker's
answer to a GUID pending here already (``Relayed``), since the broker never sees it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat

from holdfast.proto.limits import MAX_AGE_MS
from holdfast.proto.validate import properties_problem, properties_size
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.outbound import Outbound
from holdfast.sdk.producer import Producer
from holdfast.sdk.putbuffer import (
    PAYLOAD,
    PROPERTIES,
    PUT_OVERHEAD,
    QUEUE_ID,
    PendingPut,
    PutBuffer,
)
from holdfast.sdk.segment import Extra
from holdfast.sdk.state import LinkState


class Relayed(enum.Enum):
    """What ``Relayer.relay`` did with a client's PUT."""

    SENT = "sent"
    """Buffered and sent (or sent once the link is up): its outcome comes by GUID."""
    JOINED = "joined"
    """The same PUT (queue, GUID, content) is pending already: its outcome answers this."""
    CONFLICT = "conflict"
    """The GUID is pending on this queue with other content: the broker would say CONFLICT."""
    BUSY = "busy"
    """The GUID is pending on another queue: relay this one again after that outcome."""


class Relayer:
    """Buffers relayed PUTs through ``producer`` (whose checks, buffer and outbound
    queue they share with the session's own posts)."""

    def __init__(self, producer: Producer, puts: PutBuffer, outbound: Outbound) -> None:
        self._producer = producer
        self._puts = puts
        self._outbound = outbound

    def relay(
        self,
        queue_id: int,
        payload: bytes,
        properties: Mapping[str, str] | None,
        guid: bytes,
        now: float,
        age_ms: int = 0,
    ) -> Relayed:
        """``post()`` under a GUID given as its 16 bytes, for a proxy relaying its clients'
        PUTs (no ``UUID`` is made; outcomes go by ``wire_acks``). The PUT is back-dated
        by ``age_ms``, the age it arrived with, so this hop never restarts it.

        A GUID already pending here is judged as the broker judges a PUT, by queue and
        content (rule 8), so a proxy client is told what the broker would tell it: the
        same queue and content is that PUT again (``JOINED``: its outcome answers both);
        the same queue with other content is a ``CONFLICT``; another queue is another
        message, which waits until the pending one has its outcome (``BUSY``: buffered
        nothing, relay it again then)."""
        pending = self._puts.get(guid)
        if pending is not None:
            if pending[QUEUE_ID] != queue_id:
                return Relayed.BUSY
            if pending[PAYLOAD] != payload or (pending[PROPERTIES] or {}) != dict(properties or {}):
                return Relayed.CONFLICT
            return Relayed.JOINED
        if len(guid) != 16:
            raise InvalidArgumentError(f"a GUID is 16 bytes, not {len(guid)}")
        age_ms = min(age_ms, MAX_AGE_MS)
        self._producer.buffer(queue_id, payload, properties, None, now - age_ms / 1000.0, guid)
        return Relayed.SENT

    def relay_run(
        self,
        queue_id: int,
        guids: Sequence[bytes],
        payloads: Sequence[bytes],
        ages_ms: Sequence[int],
        now: float,
        properties: Mapping[int, dict[str, str]] | None = None,
    ) -> bool:
        """``relay`` for a run of PUTs of one queue, checked once and buffered in one loop;
        True if every PUT of the run was buffered (each as ``Relayed.SENT``).
        ``properties``: those of the PUTs that have any, by index in the run (``str`` to
        ``str``, as read from the wire; kept as they are, not copied).

        False, with nothing buffered, when the run needs ``relay``'s judgement PUT by PUT:
        a GUID pending already or twice in the run (rule 8), a payload over the limit,
        properties that break the limits, the disconnected buffer bound. The link and
        queue checks raise as ``relay`` does. The GUIDs are a batch's column, 16 bytes
        each by its framing."""
        producer = self._producer
        state = producer.writable_state(queue_id)
        count = len(guids)
        if not count:
            return True
        limits = producer.limits
        if max(map(len, payloads)) > limits.max_payload_bytes:
            return False
        total = sum(map(len, payloads)) + count * PUT_OVERHEAD
        extras: dict[int, Extra] | None = None
        if properties:
            extras = {}
            for index, entries in properties.items():
                if properties_problem(entries, limits) is not None:
                    return False
                # What ``Producer.buffer`` counts for them: their bytes, tags and lengths.
                added = properties_size(entries) + 4 * len(entries)
                extras[index] = (entries, None, added)
                total += added
        puts = self._puts
        active = state is LinkState.ACTIVE
        if producer.past_disconnected_limit(active, total):
            return False
        if not puts.segments.none_pending(guids):
            return False
        times: list[float] = []
        append = times.append
        shared = producer.posted_at
        last_age = -1
        posted_at = shared
        # One float per PUT and nothing else: ``buffer``'s float sharing by millisecond,
        # computed again only when the age changes along the run.
        for age_ms in ages_ms:
            if age_ms != last_age:
                last_age = age_ms
                posted_at = now - min(age_ms, MAX_AGE_MS) / 1000.0
                if 0.0 <= posted_at - shared < 0.001:
                    posted_at = shared
                else:
                    shared = posted_at
            append(posted_at)
        puts.segments.extend(guids, queue_id, payloads, times, extras)
        producer.posted_at = shared
        puts.bytes += total
        if active:
            sizes = [len(payload) + PUT_OVERHEAD for payload in payloads]
            props: Iterable[dict[str, str] | None] = repeat(None)
            if properties and extras:
                for index, extra in extras.items():
                    sizes[index] += extra[2]
                props = map(properties.get, range(count))
            made: list[PendingPut] = list(
                zip(guids, repeat(queue_id), payloads, props, repeat(None), times, sizes)
            )
            outbound = self._outbound
            outbound.items.extend(made)
            outbound.queued_bytes += total
        return True


__all__ = ["Relayed", "Relayer"]

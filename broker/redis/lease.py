"""A node's lease on the Redis store: fencing tokens, renewal, and the write mark.

A node may deliver only while it holds a lease: the key ``hf:lease:{<incarnation>}``,
whose value is a fencing token from ``hf:fence`` (a counter that only grows) and
whose TTL is ``lease + grace``. The incarnation is ``<node id>.<token>``: everything
the node delivers is kept under it (``hf:{uri}:out:<incarnation>``), and every
delivery script checks that the lease key is still there (``FENCE``), so once it has
lapsed nothing more can be claimed or moved under it.

The keeper is a thread with its own connection, so that no work of the broker's
event loop (thousands of queues, a slow batch) can delay a renewal. It renews every
``beat`` seconds; the node counts its lease valid until ``lease`` seconds after it
*sent* the last renewal that succeeded, which is at least ``grace`` before Redis lets
the key expire and a peer may reclaim the node's deliveries (``reaper``). So a node
whose link stalls or slows stops delivering, and tells its sessions, before any peer
can reclaim; a renewal that comes back later than that is treated as lapsed too. A
lapsed node rejoins under a new token: a new incarnation, whose deliveries are
reclaimable when it dies in turn.

Each renewal also moves the node's write mark (``hf:mark:{<incarnation>}``) on by one,
atomically with the lease, after reading it back. A mark below the one the node
wrote last (one above is a renewal Redis ran whose answer was lost) means Redis went
back in time (restarted from an older snapshot,
failed over to a replica that had not received everything); a missing
``hf:generation`` means it was flushed or restarted empty. Either way the keeper
reports ``StoreWentBack`` with the time of the last write Redis still had, within one
beat of the first renewal after the loss.

The marks go on across incarnations, and each renewal also writes the node's mark
under its process id (``hf:node-mark:{<node id>}``). An outage longer than the lease
makes the node rejoin under a new incarnation, whose own mark starts where the last
left off and so cannot show a loss from before it: a rejoin reads the node mark back
first, and one below the node's last is the same finding. (Nothing but this process
writes it: a peer's writes, or the node's own PUTs once Redis is back, cannot hide a
loss there as they can in a queue's write sequence.)
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from holdfast.broker.redis.bounds import MAX_LEASE, MIN_LEASE, seconds_range
from holdfast.broker.redis.keys import GENERATION, NODES, node_mark_key
from holdfast.broker.redis.lease_scripts import lease_start, next_token, renew
from holdfast.broker.redis.script import ScriptCall

log = logging.getLogger(__name__)

FENCE_COUNTER = "hf:fence"
"""The counter fencing tokens come from."""

NODE_MARK_TTL = 3600.0
"""Seconds a node mark outlives the node's last write of it: a rejoin after a longer
outage cannot tell an expired mark from a lost one, and reports nothing."""


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """How long a node's lease lasts (``--redis-lease``); the beat and the grace are a
    third of it: a node renews every ``beat``, stops acting ``lease`` after its last
    renewal, and its peers may reclaim ``lease + grace`` after it at the earliest."""

    lease: float = 3.0
    """Seconds a node may deliver after it sent its last successful renewal."""

    def __post_init__(self) -> None:
        if not MIN_LEASE <= self.lease <= MAX_LEASE:
            raise ValueError(f"the Redis lease is {seconds_range(MIN_LEASE, MAX_LEASE)}")

    @property
    def beat(self) -> float:
        """Seconds between renewals."""
        return self.lease / 3

    @property
    def grace(self) -> float:
        """Seconds between a node stopping and its lease key expiring in Redis."""
        return self.lease / 3

    @property
    def ttl_ms(self) -> int:
        """The lease key's TTL in Redis, ms."""
        return round((self.lease + self.grace) * 1000)


@dataclass(frozen=True, slots=True)
class LeaseGained:
    """The node holds a lease under ``incarnation`` (at start, and after each lapse)."""

    incarnation: str
    token: int


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """The lease of ``incarnation`` lapsed: its deliveries are no longer the node's."""

    incarnation: str
    why: str


@dataclass(frozen=True, slots=True)
class StoreWentBack:
    """Redis lost writes: everything written after ``since`` (the keeper's clock) may
    be gone."""

    why: str
    since: float
    until: float = math.inf
    """When Redis was seen to hold the older state: ACKs after it are not counted."""


LeaseEvent = LeaseGained | LeaseLost | StoreWentBack
"""What the keeper reports to the node."""


class LeaseKeeper:
    """The thread that takes, renews and checks this node's lease."""

    def __init__(
        self,
        connect: Callable[[float], Any],
        node_id: str,
        timing: LeaseTiming,
        report: Callable[[LeaseEvent], None],
        now_ms: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        cluster: bool = False,
    ) -> None:
        self._connect = connect
        self._cluster = cluster
        self._node_id = node_id
        self.timing = timing
        self._report = report
        self._now_ms = now_ms
        self.clock = clock
        self._redis: Any = None
        self._scripts: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._token = 0
        self._incarnation: str | None = None
        self._valid_until = 0.0
        self._mark = 0
        self._tried = 0
        self._mark_sent: dict[int, float] = {}
        self._generation: bytes | None = None
        self._node_marked = False
        self._failing = False
        self.renewals = 0
        """Renewals that succeeded."""
        self.lapses = 0
        """Times the lease lapsed (the node rejoined under a new token after each)."""
        self.last_renewal_seconds = 0.0
        """How long the last renewal took (the heartbeat's cost, for the bench)."""

    @property
    def incarnation(self) -> str | None:
        """The incarnation the node holds a lease under, if any."""
        return self._incarnation

    def valid(self) -> bool:
        """Whether the node may act on deliveries now (its own timer, checked before
        every claim: no peer can have reclaimed yet)."""
        return self.clock() < self._valid_until

    def start(self) -> None:
        """Start the thread; it joins at once, then renews every beat."""
        self._thread = threading.Thread(target=self._run, name="redis lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the node gives its lease back itself: ``NodeLife.stop``) and
        remove the node mark, which no rejoin will read now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timing.lease + 5)
        if self._redis is not None:
            with contextlib.suppress(RedisError):  # it expires otherwise
                self._redis.delete(node_mark_key(self._node_id))
            self._redis.close()

    def _run(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            started = self.clock()
            self.step()
            # A lapsed node rejoins at once; otherwise the next beat is a beat after
            # this one started, however long it took.
            elapsed = self.clock() - started
            wait = 0.0 if self._incarnation is None else max(0.0, self.timing.beat - elapsed)
            if self._incarnation is None and self._redis is None:
                wait = self.timing.beat

    def step(self) -> None:
        """One beat: join if the node holds no lease, else renew and check; a lease
        past its time lapses (the thread calls this; tests call it with a scripted
        clock)."""
        try:
            if self._incarnation is None:
                self._join()
            else:
                self._renew()
        except RedisError as error:
            # Once per outage at WARNING: the lapse that follows is an ERROR.
            level = logging.DEBUG if self._failing else logging.WARNING
            log.log(level, "redis lease: %s", error)
            self._failing = True
            self._redis = None  # a fresh connection next time
        except Exception:
            log.exception("redis lease keeper failed")
        else:
            self._failing = False
        if self._incarnation is not None and not self.valid():
            self._lapse(f"no renewal succeeded for {self.timing.lease:g} s")

    def _client(self) -> Any:
        if self._redis is None:
            # A call may not outlast the grace: a renewal sent just before the lease ends
            # must come back (or fail) before any peer may reclaim.
            self._redis = self._connect(self.timing.grace * 0.8)
            self._scripts = {}
        return self._redis

    def _script(self, call: ScriptCall, client: Any = None) -> Any:
        """Run a lease script call on the keeper's own connection (or queue it on the
        ``client`` pipeline); redis-py loads a script Redis forgot."""
        script = self._scripts.get(call.script.name)
        if script is None:
            script = self._scripts[call.script.name] = self._client().register_script(
                call.script.lua
            )
        return script(keys=call.keys, args=call.args, client=client)

    def _join(self) -> None:
        redis = self._client()
        if self._generation is None:
            redis.set(GENERATION, uuid.uuid4().hex.encode(), nx=True)
            self._generation = redis.get(GENERATION)
        elif self._node_marked:
            # Before this node writes anything: its next marks would hide the loss.
            self._check_rejoin(redis)
        token = int(self._script(next_token(FENCE_COUNTER, seen=self._token)))
        incarnation = f"{self._node_id}.{token}"
        sent = self.clock()
        # The new incarnation's marks go on from every mark the last one sent, so that a
        # mark Redis holds is never two renewals' at once.
        mark = self._mark = self._tried = max(self._mark, self._tried)
        self._mark_sent.setdefault(mark, sent)
        self._script(lease_start(incarnation, token=token, lease_ms=self.timing.ttl_ms, mark=mark))
        redis.set(node_mark_key(self._node_id), mark, px=round(NODE_MARK_TTL * 1000))
        self._node_marked = True
        redis.hset(NODES, incarnation, self._now_ms())
        self._token, self._incarnation = token, incarnation
        self._valid_until = sent + self.timing.lease
        log.info("redis lease taken: incarnation %s (fencing token %d)", incarnation, token)
        self._report(LeaseGained(incarnation, token))

    def _renew(self) -> None:
        incarnation = self._incarnation
        assert incarnation is not None
        redis = self._client()
        mark = self._mark + 1
        sent = self.clock()
        # A renewal whose answer is lost (Redis restarted after running it) leaves
        # Redis one mark ahead of the node: that mark is this node's own, not a loss.
        # A mark sent again keeps its first send time: Redis may hold the first write.
        self._tried = mark
        self._mark_sent.setdefault(mark, sent)
        call = renew(incarnation, token=self._token, lease_ms=self.timing.ttl_ms, mark=mark)
        node_mark, ttl_ms = node_mark_key(self._node_id), round(NODE_MARK_TTL * 1000)
        if self._cluster:  # the keys are in other slots: three calls
            ok, stored = self._script(call)
            redis.set(node_mark, mark, px=ttl_ms)
            generation = redis.get(GENERATION)
        else:  # one round trip
            pipe = redis.pipeline(transaction=False)
            self._script(call, client=pipe)
            pipe.set(node_mark, mark, px=ttl_ms)
            pipe.get(GENERATION)
            (ok, stored), _, generation = pipe.execute()
        done = self.clock()
        self.last_renewal_seconds = done - sent
        stored_text = stored.decode() if isinstance(stored, bytes) else str(stored)
        if not self._check_generation(generation):
            pass
        elif int(ok) or stored_text or done < self._valid_until:
            # A lapsed lease whose mark is gone too was reaped if the node was late;
            # if it was not, Redis lost both keys.
            self._check_mark(stored_text)
        if not int(ok):
            self._lapse("the lease had expired in Redis")
        elif done >= self._valid_until:
            self._lapse(f"the renewal came back {done - sent:.2f} s later, after the lease")
        else:
            self.renewals += 1
            self._valid_until = sent + self.timing.lease
            self._mark = mark
            self._mark_sent.pop(mark - 10_000, None)  # hours of beats are plenty

    def _check_generation(self, generation: bytes | None) -> bool:
        """Whether ``hf:generation`` is the one this node adopted; if not, report the
        loss and adopt the new one."""
        if generation == self._generation:
            return True
        why = "the generation marker is gone" if generation is None else "it changed"
        self._report(StoreWentBack(f"Redis was flushed or restarted empty ({why})", 0.0))
        redis = self._client()
        redis.set(GENERATION, uuid.uuid4().hex.encode(), nx=True)
        self._generation = redis.get(GENERATION)
        return False

    def _check_rejoin(self, redis: Any) -> None:
        """Compare the node mark Redis holds with the last one this node wrote, across
        the lapse (after the generation: an emptied Redis is reported as that)."""
        key = node_mark_key(self._node_id)
        if self._cluster:
            stored, generation = redis.get(key), redis.get(GENERATION)
        else:
            pipe = redis.pipeline(transaction=False)
            pipe.get(key)
            pipe.get(GENERATION)
            stored, generation = pipe.execute()
        until = self.clock()
        if not self._check_generation(generation):
            return
        kept = int(stored) if stored is not None else None
        if kept is not None and self._mark <= kept <= self._tried:
            self._mark = kept  # all there (the last renewal's answer may have been lost)
            return
        if kept is None and self.clock() - self._mark_sent.get(self._mark, 0.0) > NODE_MARK_TTL:
            return  # expired while Redis was out: nothing to tell
        if kept is not None and kept > self._tried:
            return  # not this node's: nothing to compare with
        since = self._mark_sent.get(0 if kept is None else kept, 0.0)
        held = "none of its marks" if kept is None else f"its mark {kept} of {self._mark}"
        self._node_marked = False  # reported once, even if this join fails and is retried
        self._report(
            StoreWentBack(
                f"Redis went back in time while this node's lease was lapsed: it holds "
                f"{held} (restarted from an older snapshot, or failed over to a replica "
                "that had not received everything)",
                since,
                until,
            )
        )

    def _check_mark(self, stored: str) -> None:
        """Compare the mark Redis holds with the one this node wrote last."""
        if stored == str(self._mark):
            return
        kept = int(stored) if stored.isdigit() else None
        if kept is not None and self._mark < kept <= self._tried:
            self._mark = kept  # a renewal Redis ran whose answer never came back
            return
        since = self._mark_sent.get(kept, 0.0) if kept is not None else 0.0
        held = "none of its marks" if kept is None else f"its mark {kept} of {self._mark}"
        self._report(
            StoreWentBack(
                f"Redis went back in time: it holds {held} (restarted from an older "
                "snapshot, or failed over to a replica that had not received everything)",
                since,
            )
        )
        if kept is not None:
            self._mark = max(self._mark, kept)

    def _lapse(self, why: str) -> None:
        incarnation = self._incarnation
        if incarnation is None:
            return
        self._incarnation = None
        self._valid_until = 0.0
        self.lapses += 1
        log.error("redis lease of %s lapsed (%s): it stops delivering", incarnation, why)
        self._report(LeaseLost(incarnation, why))


__all__ = [
    "FENCE_COUNTER",
    "NODE_MARK_TTL",
    "LeaseEvent",
    "LeaseGained",
    "LeaseKeeper",
    "LeaseLost",
    "LeaseTiming",
    "StoreWentBack",
]

"""Broker nodes sharing one Redis: leases, reclaiming, wake-ups, data loss.

A node delivers only while it holds a lease (``lease``: a fencing token, renewed
by a thread of its own); a node whose lease lapsed stops claiming, voids what its
consumers hold (they are told: ``DELIVERIES_REVOKED``), gives it back, and rejoins
under a new token. Every node also reaps (``reaper``): the deliveries of an
incarnation whose lease key expired go back to the head of their queues.

Wake-ups use pub/sub (``hf:wake``, a queue URI per message), but pub/sub loses
messages when a subscriber is disconnected, so every queue with consumers is also
polled every ``POLL`` seconds. Policy changes and deleted queues are announced on
``hf:changed``; the refresh re-reads the policies too. The timed rules (reject
delays, TTLs) run in ``sweep``.

Data loss: the lease keeper reads back its write mark and ``hf:generation`` at every
renewal, and its node mark at every rejoin. When Redis went back in time or was
emptied, the node logs LOST DATA with what it can count (``losses``), counts it
(``data_losses``) and tells every connected session (``DATA_LOST``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from holdfast.broker.redis.client import RedisClient
from holdfast.broker.redis.durable import check_all
from holdfast.broker.redis.keys import CHANGED, FORGET, WAKE
from holdfast.broker.redis.lease import (
    LeaseEvent,
    LeaseGained,
    LeaseKeeper,
    LeaseLost,
    LeaseTiming,
    StoreWentBack,
)
from holdfast.broker.redis.losscheck import LossCheck
from holdfast.broker.redis.losses import AckJournal, DataLoss
from holdfast.broker.redis.reaper import Reaper
from holdfast.broker.redis.refresh import refresh_queues
from holdfast.broker.redis.refusals import setup_failure, wrong_kind
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.sweep import FAST, Sweeper
from holdfast.broker.store import StoreError

log = logging.getLogger(__name__)

POLL = 0.2
"""Seconds between polls of the queues this node has consumers on."""

REFRESH = 1.0
"""Seconds between reads of the open queues' counts and the policies; more with many
open queues: the pause after a pass is at least ``REFRESH_SHARE`` of it."""

HALT_WAIT = 2.0
"""Seconds ``halt`` waits for its loops after each cancel."""

PROBE_TIMEOUT = 5.0
"""Seconds the start-up check waits for Redis (``NodeLife._check_setup``)."""

REFRESH_SHARE = 4.0
"""A refresh pass takes at most a fifth of the event loop (with 100,000 open queues a
pass takes seconds, and the next one waits four times that)."""


class NodeLife:
    """This node's lease, reaper, refresh, wake-up listener and data-loss reports."""

    def __init__(
        self,
        client: RedisClient,
        registry: RedisRegistry,
        on_data_loss: Callable[[DataLoss], None],
        timing: LeaseTiming | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.registry = registry
        self.timing = timing if timing is not None else LeaseTiming()
        self.journal = AckJournal(clock)
        """SUCCESS ACKs per queue and second, for the loss reports."""
        self.keeper = LeaseKeeper(
            client.connect_sync,
            registry.node_id,
            self.timing,
            self._from_keeper,
            registry.now_ms,
            clock,
            client.spec.cluster,
        )
        self.reaper = Reaper(registry)
        self.losses = LossCheck(registry, self.journal, on_data_loss, self.timing.lease, clock)
        self._joined = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._halting = False
        self.revoked = 0
        """Deliveries voided because the lease lapsed."""

    @property
    def data_losses(self) -> int:
        """Times this node found that Redis had lost data."""
        return self.losses.losses

    @property
    def reclaimed(self) -> int:
        """Deliveries of dead incarnations this node put back."""
        return self.reaper.reclaimed

    async def start(self) -> None:
        """Take a lease and start the loops. Raises ``StoreError`` if Redis cannot be
        reached within the retry window."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._check_setup)
        self.registry.may_deliver = self.keeper.valid
        self.registry.on_went_back = self.losses.check
        self.keeper.start()
        try:
            await asyncio.wait_for(self._joined.wait(), self.client.retry_window)
        except TimeoutError:
            self.keeper.stop()
            raise StoreError(
                f"redis store {self.client.where}: no lease taken in "
                f"{self.client.retry_window:g} s (is Redis reachable?)"
            ) from None
        # Subscribed before the first read of the policies: a change made after the
        # read is announced to this node, one made before it is in the read (another
        # node's change while this one was starting was missed for a heartbeat).
        pubsub = None if self.client.spec.cluster else await self._subscribe_once()
        await self.registry.policies.refresh()
        loop = self._loop
        self._tasks = [
            loop.create_task(self._every(self.timing.beat, self.reaper.reap), name="redis reaper"),
            loop.create_task(
                self._every(REFRESH, self._refresh, REFRESH_SHARE), name="redis refresh"
            ),
            loop.create_task(self._every(self.timing.beat, self.losses.check), name="redis losses"),
            loop.create_task(self._poll(), name="redis poll"),
            loop.create_task(self._every(REFRESH, self._durable), name="redis durability"),
            loop.create_task(self._every(FAST, Sweeper(self.registry).sweep), name="redis sweep"),
        ]
        if not self.client.spec.cluster:  # cluster pub/sub is not in redis-py's asyncio API
            self._tasks.append(loop.create_task(self._listen(pubsub), name="redis wake-ups"))

    def _check_setup(self) -> None:
        """Fail at once on a refusal no retry mends (``refusals``: a TLS certificate,
        the credentials, the database, a scheme that does not match the server): it is
        not an outage. Anything else (Redis down) is left to the lease keeper's retries."""
        probe = None
        failure = None
        try:
            # A cluster's client connects here, in its constructor.
            probe = self.client.connect_sync(min(self.client.retry_window, PROBE_TIMEOUT))
            probe.ping()
            failure = wrong_kind(probe, self.client.spec)
        except Exception as error:
            has_cert = bool(self.client.tls and self.client.tls.cert)
            failure = setup_failure(error, self.client.spec, has_cert)
        finally:
            if probe is not None:
                probe.close()
        if failure is not None:
            raise StoreError(f"redis store {self.client.where}: {failure}")

    async def halt(self) -> None:
        """Stop the loops (polls, sweeps, refresh, reaper), so that nothing new is
        started while the node drains its work; the lease goes on. Idempotent."""
        # The flag ends a loop at its next turn even if its cancel is lost: a
        # cancellation that lands inside a Redis call can be absorbed by the client
        # (seen: the sweep loop went on, and halt() waited on it forever).
        self._halting = True
        pending, self._tasks = set(self._tasks), []
        for _ in range(2):  # a second cancel for a task that absorbed the first
            if not pending:
                break
            for task in pending:
                task.cancel()
            done, pending = await asyncio.wait(pending, timeout=HALT_WAIT)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: nothing to report for a stopping loop
        for task in pending:
            log.warning("redis: %s did not stop within %g s", task.get_name(), 2 * HALT_WAIT)

    async def stop(self) -> None:
        """Stop the loops and the lease, and give back what this node delivered and was
        not confirmed (at once, instead of after the lease expires)."""
        await self.halt()
        await asyncio.to_thread(self.keeper.stop)
        with contextlib.suppress(StoreError):
            await self.reaper.reclaim(self.registry.node_id)

    # -- the keeper's reports, on the event loop ----------------------------------------

    def _from_keeper(self, event: LeaseEvent) -> None:
        """Called on the keeper's thread: hand the event to the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_event, event)

    def _on_event(self, event: LeaseEvent) -> None:
        registry = self.registry
        if isinstance(event, LeaseGained):
            lapsed = registry.node_id if self._joined.is_set() else None
            registry.rejoined(event.incarnation)
            self._joined.set()
            if lapsed is not None and lapsed != event.incarnation:
                registry.spawn(self._give_back(lapsed))
        elif isinstance(event, LeaseLost):
            revoked = registry.revoke()
            self.revoked += revoked
            log.error(
                "redis lease lapsed (%s): %d deliveries of this node's consumers revoked; "
                "they go back to their queues",
                event.why,
                revoked,
            )
        elif isinstance(event, StoreWentBack):
            registry.spawn(self.losses.check(event))

    async def _give_back(self, incarnation: str) -> None:
        try:
            moved = await self.reaper.reclaim(incarnation)
            log.warning("gave back %d deliveries of lapsed incarnation %s", moved, incarnation)
        except StoreError as error:  # the reapers finish it once its lease key expired
            log.warning("could not give back lapsed incarnation %s yet: %s", incarnation, error)

    # -- loops -------------------------------------------------------------------------

    async def _every(self, seconds: float, work: Callable[[], Any], share: float = 0.0) -> None:
        took = 0.0
        while not self._halting:
            await asyncio.sleep(max(seconds, share * took))
            if self._halting:
                return
            started = time.monotonic()
            try:
                await work()
            except StoreError as error:
                log.warning("redis: %s", error)
            except Exception:
                log.exception("redis background work failed")
            took = time.monotonic() - started

    async def _refresh(self) -> None:
        await refresh_queues(self.registry)
        await self.registry.policies.refresh()

    async def _durable(self) -> None:
        await check_all(self.registry)

    async def _poll(self) -> None:
        while not self._halting:
            await asyncio.sleep(POLL)
            for queue in self.registry:
                if queue.consumers:
                    queue.deliver()

    async def _changed(self, what: str) -> None:
        if what.startswith(FORGET):
            self.registry.forget(what[len(FORGET) :])
        else:
            await self.registry.policies.refresh()

    async def _subscribe(self) -> Any:
        """Subscribe to ``WAKE`` and ``CHANGED`` and wait until Redis confirmed both, so
        that every message published from then on reaches this node."""
        pubsub = self.client.redis.pubsub()
        try:
            await pubsub.subscribe(WAKE, CHANGED)
            deadline = time.monotonic() + self.client.retry_window
            confirmed = 0
            while confirmed < 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreError("redis did not confirm the wake-up subscription")
                message = await pubsub.get_message(timeout=left)
                if message is not None and message.get("type") == "subscribe":
                    confirmed += 1
        except BaseException:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            raise
        return pubsub

    async def _subscribe_once(self) -> Any:
        """``_subscribe``, or ``None`` if it failed (``_listen`` tries again)."""
        try:
            return await self._subscribe()
        except Exception as error:  # polling and the refresh cover the gap
            log.debug("redis wake-ups: %s", error)
            return None

    async def _listen(self, pubsub: Any = None) -> None:
        while not self._halting:
            try:
                if pubsub is None:
                    pubsub = await self._subscribe()
                    # What changed while this node was not subscribed.
                    await self.registry.policies.refresh()
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    data = message["data"]
                    text = data.decode() if isinstance(data, bytes) else str(data)
                    channel = message["channel"]
                    if channel in (WAKE, WAKE.encode()):
                        self.registry.on_wake(text)
                    else:
                        await self._changed(text)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a lost subscription: polling covers the gap
                log.debug("redis wake-ups: %s", error)
                await asyncio.sleep(REFRESH)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                pubsub = None


__all__ = ["HALT_WAIT", "POLL", "REFRESH", "NodeLife"]

"""The node's check for lost writes, every beat and whenever the lease keeper saw
Redis go back (``losses`` says how; ``lease`` says what the keeper reads)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.lease import StoreWentBack
from holdfast.broker.redis.losses import AckJournal, DataLoss, describe
from holdfast.broker.redis.policy_scripts import repair
from holdfast.broker.redis.registry import RedisRegistry

log = logging.getLogger(__name__)

BATCH = 500
"""Sequences read in one pipeline."""

WENT_BACK = (
    "the write sequence of {n} queues went back (Redis restarted from an older "
    "snapshot, failed over to a replica that lagged, or was flushed)"
)


class LossCheck:
    """Reads back the write sequences of the queues this node wrote; reports a loss."""

    def __init__(
        self,
        registry: RedisRegistry,
        journal: AckJournal,
        report: Callable[[DataLoss], None],
        quiet: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._journal = journal
        self._report = report
        self._quiet = quiet
        self._clock = clock
        self._last_report = -1e9
        self.losses = 0
        """Losses reported."""

    async def check(self, seen: StoreWentBack | None = None) -> None:
        """One pass; ``seen`` is the keeper's finding that set it off, if any."""
        affected = await self._went_back()
        registry = self._registry
        registry.repairing.update(affected)
        try:
            for uri in affected:
                await self._repair(uri)
        finally:
            registry.repairing.difference_update(affected)
            for uri in affected:
                registry.wake(uri)
        if affected:
            why = seen.why if seen is not None else WENT_BACK.format(n=len(affected))
            acked = {uri: self._journal.since(uri, moment) for uri, moment in affected.items()}
            self._emit(why, {uri: n for uri, n in acked.items() if n} or dict.fromkeys(affected, 0))
        elif seen is not None and self._clock() - self._last_report > self._quiet:
            # The node's mark or the generation went back, but no queue this node wrote:
            # report it once, with what the node ACKed anywhere since.
            acked = self._journal.queues_since(seen.since, seen.until) if seen.since > 0 else {}
            self._emit(seen.why, acked, covered=seen.since > 0)

    async def _repair(self, uri: str) -> None:
        """Re-apply what the node remembers of ``uri`` (``RecentWork``): confirmed
        messages go again, and no delivery count stays below one a consumer saw."""
        registry = self._registry
        counts, confirmed = registry.recent.of(uri)
        if not counts and not confirmed:
            return
        raised, removed = await registry.client.run(
            repair(QueueKeys(uri), counts=counts, confirmed=confirmed)
        )
        log.warning(
            "%s: after the loss, %d confirms re-applied and %d delivery counts raised back",
            uri,
            int(removed),
            int(raised),
        )

    def _emit(self, why: str, acked: dict[str, int], covered: bool = True) -> None:
        self.losses += 1
        self._last_report = self._clock()
        loss = describe(self._registry.client.where, why, acked, covered)
        log.error("%s", loss.message)
        self._report(loss)

    async def _went_back(self) -> dict[str, float]:
        """Queues whose sequence in Redis is below what this node saw: from when."""
        registry = self._registry
        client = registry.client
        uris = registry.seqs.queues()
        affected: dict[str, float] = {}
        for start in range(0, len(uris), BATCH):
            chunk = uris[start : start + BATCH]
            # What the node saw before the read is sent: Redis held at least that when
            # the GET ran. A script that ran after the GET can return a higher sequence
            # while the read is on its way back; comparing with that one would report
            # a loss that never happened (seen on a loaded host, several times a run).
            before = [registry.seqs.highest(uri) for uri in chunk]

            async def read(chunk: list[str] = chunk) -> list[Any]:
                pipe = client.redis.pipeline(transaction=False)
                for uri in chunk:
                    pipe.get(QueueKeys(uri).seq)
                result: list[Any] = await pipe.execute()
                return result

            values = await client.call("write sequences", read)
            for uri, seen, value in zip(chunk, before, values, strict=True):
                moment = registry.seqs.went_back(uri, int(value or 0), seen)
                if moment is not None:
                    affected[uri] = moment
        return affected


__all__ = ["BATCH", "LossCheck"]

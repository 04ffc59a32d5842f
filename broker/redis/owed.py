"""Writes a node owes Redis: give-backs and confirms that failed, tried again until done.

A node gives messages back to their queue's head when a consumer leaves or rejects
them (``REQUEUE``) and when a claim found nobody to hand them to (``UNCLAIM``); it
removes what its consumers confirmed (``CONFIRM``). When Redis does not take one of
these within the client's retry window (refused, or unreachable from the node's pool
while its lease connection still works), the messages stay in the node's deliveries in
Redis: given back to nobody, or confirmed and kept. Before, they waited there for the
node's end (or its lease to lapse), then were delivered again. The node now keeps what
it owes per queue, and its sweep tries it again once a second (``pay``). A queue claims
nothing while a give-back of it is owed, so what goes back is at the head before
anything behind it is handed out. The scripts act only on messages still in the node's
deliveries, so a write that ran once and lost its reply is harmless to repeat.

What a node owes belongs to its incarnation: once it rejoined under a new one (its
lease lapsed), its old deliveries are the reaper's, and the debt is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from holdfast.broker.redis import scripts
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.scripts import Unclaimed
from holdfast.broker.store import StoreError

if TYPE_CHECKING:
    from holdfast.broker.redis.registry import RedisRegistry

log = logging.getLogger(__name__)


class OwedWrites:
    """What one node failed to write back, per queue, oldest first."""

    def __init__(self) -> None:
        # uri -> (incarnation, unclaims, requeues)
        self._owed: dict[str, tuple[str, list[Unclaimed], list[bytes]]] = {}
        self._paying: set[str] = set()
        # uri -> (incarnation, confirmed GUIDs): they block no claim.
        self._confirms: dict[str, tuple[str, list[bytes]]] = {}

    def owes(self, uri: str) -> bool:
        """Whether a give-back of ``uri`` waits (its queue claims nothing meanwhile)."""
        return uri in self._owed or uri in self._paying

    def __len__(self) -> int:
        """Messages owed, over every queue."""
        confirms = sum(len(guids) for _, guids in self._confirms.values())
        return confirms + sum(len(u) + len(r) for _, u, r in self._owed.values())

    def confirm(self, uri: str, node: str, guids: list[bytes]) -> None:
        """A CONFIRM of ``guids`` by ``node`` failed: the messages would stay in Redis, and
        be delivered again when the node ends."""
        owner, owed = self._confirms.setdefault(uri, (node, []))
        if owner != node:
            self._confirms[uri] = owner, owed = (node, [])
        owed.extend(guids)

    def add(
        self,
        uri: str,
        node: str,
        unclaims: list[Unclaimed] | None = None,
        requeues: list[bytes] | None = None,
    ) -> None:
        """An UNCLAIM of ``unclaims`` or a REQUEUE of ``requeues`` by ``node`` failed."""
        owner, owed_unclaims, owed_requeues = self._owed.setdefault(uri, (node, [], []))
        if owner != node:
            self._owed[uri] = owner, owed_unclaims, owed_requeues = (node, [], [])
        owed_unclaims.extend(unclaims or ())
        owed_requeues.extend(requeues or ())

    async def pay(self, registry: RedisRegistry) -> int:
        """Try the owed writes again (confirms, then give-backs); how many messages they
        covered. The first that fails again (logged) ends the pass: each try can take
        the client's whole retry window, and the sweep waits for the pass."""
        done = 0
        for uri in list(self._confirms):
            node, guids = self._confirms.pop(uri)
            if node != registry.node_id:
                continue
            if not await _run(uri, "CONFIRM", registry.remove(uri, guids)):
                self.confirm(uri, node, guids)
                return done
            done += len(guids)
        for uri in list(self._owed):
            node, unclaims, requeues = self._owed.pop(uri)
            if node != registry.node_id:
                continue  # the reaper's now, with the rest of the old incarnation's
            self._paying.add(uri)
            try:
                keys = QueueKeys(uri)
                lease = registry.lease(keys)
                if unclaims:
                    call = scripts.unclaim(keys, node=node, lease=lease, messages=unclaims)
                    if await _run(uri, "UNCLAIM", registry.client.run(call)):
                        done, unclaims = done + len(unclaims), []
                if requeues and not unclaims:
                    call = scripts.requeue(keys, node=node, lease=lease, guids=requeues)
                    if await _run(uri, "REQUEUE", registry.client.run(call)):
                        done, requeues = done + len(requeues), []
            finally:
                self._paying.discard(uri)
            if unclaims or requeues:
                # Still owed, ahead of what failed while this was tried.
                _, later_unclaims, later_requeues = self._owed.pop(uri, (node, [], []))
                self._owed[uri] = (node, unclaims + later_unclaims, requeues + later_requeues)
                break
            registry.wake(uri)  # its claims waited: they look again
        return done


async def _run(uri: str, what: str, write: Awaitable[object]) -> bool:
    try:
        await write
    except StoreError as error:
        log.error("%s: messages still to write back (%s): %s", uri, what, error)
        return False
    log.warning("%s: messages written back late (%s)", uri, what)
    return True


__all__ = ["OwedWrites"]

"""The deliveries a server revoked and told its client of, until their CONFIRMs come.

A Redis broker node that loses its lease voids its consumers' deliveries and tells each
session which (``DELIVERIES_REVOKED``, ``Outbox.revoke``). Their CONFIRMs (and
REJECTs) are refused from then on, ``UNKNOWN_GUID``, as documented: the client's
CONFIRMs may cross the notice, and an app that confirms what it was told is void gets
``ConfirmRejected``. The client did nothing wrong, so these refusals must not count
against ``--confirm-errors-per-second``, which ends a session that confirms what it
does not hold: a node that revoked 300 deliveries would otherwise end the session of
the consumer that held them, or through a proxy the proxy's whole upstream session.

Each is forgotten once refused, and a handle's when it closes; the rest go with the
session. What is remembered is at most what the session held when its deliveries were
revoked, and never more than ``MAX_REVOKED`` (the oldest go first: a refusal of one
of those counts, as it did before).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import islice

from holdfast.proto import pb

MAX_REVOKED = 100_000
"""Revoked deliveries one session remembers at most (several lapses of a node's lease
in one session, each revoking deliveries the client then never confirms)."""


class RevokedDeliveries:
    """One session's revoked deliveries, as (queue_id, guid), oldest first."""

    __slots__ = ("_held", "limit")

    def __init__(self, limit: int = MAX_REVOKED) -> None:
        self.limit = limit
        """Most deliveries remembered."""
        self._held: dict[tuple[int, bytes], None] = {}

    def __len__(self) -> int:
        return len(self._held)

    def add(self, queue_id: int, guids: Iterable[bytes]) -> None:
        """The deliveries ``guids`` under handle ``queue_id`` were revoked, and the
        client told so."""
        held = self._held
        for guid in guids:
            held[(queue_id, guid)] = None
        excess = len(held) - self.limit
        if excess > 0:
            for key in list(islice(held, excess)):
                del held[key]

    def forgive(self, refused: Mapping[tuple[pb.Status, int], list[bytes]]) -> int:
        """How many of the refused CONFIRMs (or REJECTs) ``refused``, by (status,
        queue_id), name a revoked delivery; those are forgotten (a second refusal of
        one counts)."""
        held = self._held
        if not held:
            return 0
        forgiven = 0
        for (_, queue_id), guids in refused.items():
            for guid in guids:
                key = (queue_id, guid)
                if key in held:
                    del held[key]
                    forgiven += 1
        return forgiven

    def forget(self, queue_id: int) -> None:
        """Handle ``queue_id`` closed: its revoked deliveries are no longer settled on
        it (and the client may open another handle under the same id)."""
        if self._held:
            self._held = {key: None for key in self._held if key[0] != queue_id}

    def clear(self) -> None:
        """The session ended."""
        self._held.clear()


__all__ = ["MAX_REVOKED", "RevokedDeliveries"]

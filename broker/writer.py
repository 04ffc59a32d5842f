"""Who a PUT is written for: the writes the broker makes on a client's behalf beyond the
queue the client opened (a redirect, a dead-letter notice that may create a queue, a
replay of a dead letter into its ``x-original-uri``) are checked against that client's
token, at the PUT, with the same limits as its own opens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from holdfast.proto import pb
from holdfast.proto.policy import DEAD_LETTER_NOTIFY, ORIGINAL_URI
from holdfast.proto.validate import Invalid, parse_queue_uri
from holdfast.server.guard import SessionGuard

_OK: pb.Status = pb.STATUS_OK

DERIVED = frozenset({DEAD_LETTER_NOTIFY, ORIGINAL_URI})
"""Properties naming a queue the broker may later write the message (or a notice) to:
a PUT carrying one goes through ``Writer.derived_status``."""


class QueueLookup(Protocol):
    """The queues a broker knows (both registries have ``get``)."""

    def get(self, uri: str) -> object | None:
        """The queue at ``uri``, if the broker has it."""
        ...


@dataclass(frozen=True, slots=True)
class Writer:
    """A session's token and id, as the PUT path needs them."""

    guard: SessionGuard
    session_id: str

    def notify_status(self, notify: str, queues: QueueLookup) -> pb.Status:
        """OK, or the status that refuses a PUT naming ``notify`` as its
        ``x-dead-letter-notify`` queue (PERMISSION_DENIED, LIMIT_EXCEEDED)."""
        refusal = self.guard.check_derived_put(
            notify, queues.get(notify) is not None, self.session_id
        )
        return _OK if refusal is None else refusal[0]

    def derived_status(self, properties: Mapping[str, str], queues: QueueLookup) -> pb.Status:
        """OK, or the status that refuses a PUT for the queues its properties name
        (``DERIVED``): its dead-letter notice queue, and its ``x-original-uri``, which a
        ``dlq replay`` writes into (PERMISSION_DENIED unless the client may write it)."""
        notify = properties.get(DEAD_LETTER_NOTIFY)
        if notify is not None and (status := self.notify_status(notify, queues)) != _OK:
            return status
        origin = properties.get(ORIGINAL_URI)
        refusal = None if origin is None else self.guard.check_original_uri(origin)
        return _OK if refusal is None else refusal[0]

    def redirect_status(self, target: str) -> pb.Status:
        """OK, or PERMISSION_DENIED if the client may not write ``target``'s domain (the
        queue it posts to redirects there)."""
        try:
            domain = parse_queue_uri(target).domain
        except Invalid:
            return _OK  # a policy is validated when it is set
        refusal = self.guard.check_write(domain, f"the redirect to {target}")
        return _OK if refusal is None else refusal[0]


__all__ = ["DERIVED", "QueueLookup", "Writer"]

"""Who a PUT is written for: the writes the broker makes on a client's behalf beyond the
queue the client opened (a redirect, a dead-letter notice that may create a queue) are
checked against that client's token, at the PUT, with the same limits as its own opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from holdfast.proto import pb
from holdfast.proto.validate import Invalid, parse_queue_uri
from holdfast.server.guard import SessionGuard

_OK: pb.Status = pb.STATUS_OK


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

    def redirect_status(self, target: str) -> pb.Status:
        """OK, or PERMISSION_DENIED if the client may not write ``target``'s domain (the
        queue it posts to redirects there)."""
        try:
            domain = parse_queue_uri(target).domain
        except Invalid:
            return _OK  # a policy is validated when it is set
        refusal = self.guard.check_write(domain, f"the redirect to {target}")
        return _OK if refusal is None else refusal[0]


__all__ = ["QueueLookup", "Writer"]

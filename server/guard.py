"""What a server enforces on each client session: its token and its limits.

``ServerGuard`` is built once per server (broker or proxy) from its ``--auth-file``
and ``SessionLimits``; it hands each session stream a ``SessionGuard`` that knows the
session's grant (from the ``authorization`` metadata, ``holdfast.server.auth``) and
counts what the session does:

- the token: a session without a valid one is ended with ``UNAUTHENTICATED`` when its
  Hello arrives; opening a queue for read needs ``read`` on its domain, for write
  ``write`` (``PERMISSION_DENIED`` for that request only);
- open queues per session and new queues per minute per token (per session without
  an auth file): ``LIMIT_EXCEEDED`` for that open;
- frames per second per session: past the rate the session's frames are not read
  until its budget refills (gRPC flow control pushes back on the client), and the
  client is told once per second with a non-fatal ``LIMIT_EXCEEDED`` error;
- refused CONFIRMs per second: a session past it is ended (``LIMIT_EXCEEDED``), as a
  client that keeps confirming what it does not hold is broken.

Buckets are token buckets on the monotonic clock. Everything runs on the server's
event loop; the per-token buckets are shared by that token's sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from holdfast.proto import pb
from holdfast.proto.credentials import bearer_token
from holdfast.proto.validate import Invalid, parse_queue_uri
from holdfast.server.auth import Authorizer, Grant

ANONYMOUS = Grant("anonymous", frozenset({"*"}), frozenset({"*"}), admin=True)
"""Everyone's grant on a server without ``--auth-file``."""


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Per-session and per-token limits; defaults suit one busy service per session."""

    max_open_queues: int = 1000
    """Queue handles one session may hold open."""
    new_queues_per_minute: int = 600
    """Queues one token (one session, without an auth file) may create per minute."""
    frames_per_second: int = 20_000
    """Client frames one session may send per second (a frame carries many PUTs)."""
    confirm_errors_per_second: int = 100
    """Refused CONFIRMs (and REJECTs) per second before a session is ended."""

    def __post_init__(self) -> None:
        for name in (
            "max_open_queues",
            "new_queues_per_minute",
            "frames_per_second",
            "confirm_errors_per_second",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


class Bucket:
    """A token bucket: ``rate`` per second, holding at most ``burst``."""

    __slots__ = ("_clock", "_level", "_stamp", "burst", "rate")

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._level = burst
        self._stamp = clock()

    def take(self, amount: float = 1.0) -> bool:
        """Take ``amount`` if the bucket holds it."""
        self._refill()
        if self._level >= amount:
            self._level -= amount
            return True
        return False

    def wait_time(self, amount: float = 1.0) -> float:
        """Seconds until ``amount`` is available."""
        self._refill()
        return max(0.0, (amount - self._level) / self.rate)

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.burst, self._level + (now - self._stamp) * self.rate)
        self._stamp = now


class ServerGuard:
    """A server's authorizer and limits; makes a ``SessionGuard`` per session."""

    def __init__(
        self,
        authorizer: Authorizer | None = None,
        limits: SessionLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.authorizer = authorizer
        self.limits = limits or SessionLimits()
        self._clock = clock
        self._new_queues: dict[str, Bucket] = {}

    def session(self, token: str | None) -> SessionGuard:
        """The guard of a session that presented ``token`` (None: none)."""
        grant = ANONYMOUS if self.authorizer is None else self.authorizer.authenticate(token)
        return SessionGuard(self, grant, token is not None)

    def new_queue_bucket(self, owner: str) -> Bucket:
        """The new-queues-per-minute bucket of a token (or a session)."""
        bucket = self._new_queues.get(owner)
        if bucket is None:
            per_minute = self.limits.new_queues_per_minute
            bucket = self._new_queues[owner] = Bucket(per_minute / 60, per_minute, self._clock)
        return bucket

    def clock(self) -> float:
        """The guard's clock."""
        return self._clock()


class SessionGuard:
    """One session's grant and counters (see the module docstring)."""

    def __init__(self, server: ServerGuard, grant: Grant | None, presented: bool) -> None:
        self._server = server
        self.limits = server.limits
        self.grant = grant
        self._presented = presented
        limits = server.limits
        self._frames = Bucket(limits.frames_per_second, limits.frames_per_second, server.clock)
        self._confirm_errors = Bucket(
            limits.confirm_errors_per_second, limits.confirm_errors_per_second, server.clock
        )
        self._told_at = -1.0
        self.open_queues = 0
        """Queue handles this session holds open (kept by the stream)."""

    def refusal(self) -> str | None:
        """Why the session may not start (no or an unknown token), or None."""
        if self.grant is not None:
            return None
        return "a token is required" if not self._presented else "the token is not valid"

    def check_open(
        self, domain: str, read: bool, write: bool, creates: bool, session_id: str
    ) -> tuple[pb.Status, str] | None:
        """Why an open of a queue of ``domain`` is refused, or None. ``creates``: the
        queue does not exist yet. Checks permissions before looking at anything else,
        so a refusal says nothing about which queues exist."""
        grant = self.grant
        assert grant is not None  # a session without a grant never gets this far
        if read and not grant.can_read(domain):
            return (
                pb.STATUS_PERMISSION_DENIED,
                f"token {grant.name!r} may not read domain {domain!r}",
            )
        if write and not grant.can_write(domain):
            return (
                pb.STATUS_PERMISSION_DENIED,
                f"token {grant.name!r} may not write domain {domain!r}",
            )
        limits = self._server.limits
        if self.open_queues >= limits.max_open_queues:
            return (
                pb.STATUS_LIMIT_EXCEEDED,
                f"this session holds {self.open_queues} open queues, the limit",
            )
        owner = grant.name if self._server.authorizer is not None else session_id
        if creates and not self._server.new_queue_bucket(owner).take():
            return (
                pb.STATUS_LIMIT_EXCEEDED,
                f"more than {limits.new_queues_per_minute} new queues a minute",
            )
        return None

    def check_write(self, domain: str, what: str) -> tuple[pb.Status, str] | None:
        """Why a write into ``domain`` made for this session (``what``: a dead-letter
        notice, a redirect) is refused, or None: the broker writes nowhere for a client
        that the client's token could not write itself."""
        grant = self.grant
        if grant is not None and grant.can_write(domain):
            return None
        name = grant.name if grant is not None else "none"
        return (
            pb.STATUS_PERMISSION_DENIED,
            f"token {name!r} may not write domain {domain!r} ({what})",
        )

    def check_derived_put(
        self, notify: str, exists: bool | None, session_id: str
    ) -> tuple[pb.Status, str] | None:
        """Why a PUT naming ``notify`` as its ``x-dead-letter-notify`` queue is refused,
        or None: the notice would be a write into that queue on this client's behalf,
        so it needs the client's write permission there, and creating the queue counts
        against the token's new-queues-a-minute limit, now, at the PUT (``exists``: None
        when this server cannot tell, as a proxy cannot). An invalid URI is left to the
        PUT's own validation."""
        try:
            domain = parse_queue_uri(notify).domain
        except Invalid:
            return None
        refusal = self.check_write(domain, f"the dead-letter notice to {notify}")
        if refusal is not None or exists is not False:
            return refusal
        owner = (
            self.grant.name if self.grant is not None and self._server.authorizer else session_id
        )
        if not self._server.new_queue_bucket(owner).take():
            return (
                pb.STATUS_LIMIT_EXCEEDED,
                f"more than {self._server.limits.new_queues_per_minute} new queues a minute "
                f"(the dead-letter notice to {notify} would create one)",
            )
        return None

    def check_read(self, domain: str) -> tuple[pb.Status, str] | None:
        """Why reading ``domain`` (counting its consumers) is refused, or None."""
        grant = self.grant
        if grant is not None and grant.can_read(domain):
            return None
        name = grant.name if grant is not None else "none"
        return pb.STATUS_PERMISSION_DENIED, f"token {name!r} may not read domain {domain!r}"

    def frame_delay(self) -> float:
        """Take one frame from the budget; the seconds to pause first if it is spent."""
        if self._frames.take():
            return 0.0
        return self._frames.wait_time()

    def should_tell(self) -> bool:
        """Whether to tell the client about a pause now (at most once a second)."""
        now = self._server.clock()
        if now - self._told_at >= 1.0:
            self._told_at = now
            return True
        return False

    def confirm_errors(self, count: int) -> bool:
        """Count refused CONFIRMs; False once the session is past its rate."""
        return count == 0 or self._confirm_errors.take(count)


def unary_refusal(
    guard: ServerGuard, context: Any, uri: str | None, write: bool, admin: bool = False
) -> tuple[pb.Status, str] | None:
    """Why a unary call (commit marks, admin) is refused for the token in its metadata,
    or None: UNAUTHENTICATED without a valid token, PERMISSION_DENIED without ``admin``
    (for an admin call) or without read/write on ``uri``'s domain."""
    if guard.authorizer is None:
        return None
    metadata = getattr(context, "invocation_metadata", None)
    session = guard.session(bearer_token(metadata() if metadata is not None else None))
    refusal = session.refusal()
    if refusal is not None:
        return pb.STATUS_UNAUTHENTICATED, refusal
    grant = session.grant
    assert grant is not None
    if admin and not grant.admin:
        return pb.STATUS_PERMISSION_DENIED, f"token {grant.name!r} is not an admin token"
    if uri is not None:
        try:
            domain = parse_queue_uri(uri).domain
        except Invalid:
            return None  # the call itself answers INVALID_ARGUMENT
        allowed = grant.can_write(domain) if write else grant.can_read(domain)
        if not allowed:
            verb = "write" if write else "read"
            return pb.STATUS_PERMISSION_DENIED, f"token {grant.name!r} may not {verb} {domain!r}"
    return None


async def pause(seconds: float) -> None:
    """Pause a session's reading (its budget is spent)."""
    await asyncio.sleep(seconds)


__all__ = [
    "ANONYMOUS",
    "Bucket",
    "ServerGuard",
    "SessionGuard",
    "SessionLimits",
    "pause",
    "unary_refusal",
]

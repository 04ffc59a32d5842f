"""What a server enforces on each client session: its token and its limits.

``ServerGuard`` is built once per server (broker or proxy) from its ``--auth-file``
and ``SessionLimits``; it hands each session stream a ``SessionGuard`` that knows the
session's grant (from the ``authorization`` metadata, ``holdfast.server.auth``) and
counts what the session does:

- the token: a session without a valid one is ended with ``UNAUTHENTICATED`` when its
  Hello arrives; opening a queue for read needs ``read`` on its domain, for write
  ``write`` (``PERMISSION_DENIED`` for that request only);
- open queues per session and new queues per minute per token (per session without
  an auth file): ``LIMIT_EXCEEDED`` for that open. A proxy's session carries all its
  clients' opens, so a session whose Hello says it relays clients
  (``relays_clients``) and whose token may (``"proxy": true``; any session without an
  auth file) is limited per client instead: the proxy limits each client's open
  queues itself, and names the client of each open (``OpenQueue.for_client``), whose
  new queues the broker counts apart, at the client rate. On top, the proxy bounds
  (open queues per proxy session, new queues a minute per proxy token) keep one proxy
  from exhausting the broker;
- frames per second per session: past the rate the session's frames are not read
  until its budget refills (gRPC flow control pushes back on the client), and the
  client is told once per second with a non-fatal ``LIMIT_EXCEEDED`` error;
- refused CONFIRMs per second: a session past it is ended (``LIMIT_EXCEEDED``), as a
  client that keeps confirming what it does not hold is broken (revoked deliveries it
  was told of aside: ``holdfast.server.revoked``).

Buckets are token buckets on the monotonic clock, on the server's event loop; the
per-token buckets are shared by that token's sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from holdfast.proto import pb
from holdfast.proto.credentials import bearer_token
from holdfast.proto.policy import ORIGINAL_URI, is_template
from holdfast.proto.validate import Invalid, parse_queue_uri
from holdfast.server.auth import Authorizer, Grant

MAX_BUCKETS = 10_000
"""New-queue buckets kept before the full ones (as good as new) are dropped."""

Refusal = tuple[pb.Status, str]
"""A typed status and its one line of explanation."""

ANONYMOUS = Grant("anonymous", frozenset({"*"}), frozenset({"*"}), admin=True, proxy=True)
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
    proxy_max_open_queues: int = 100_000
    """Queue handles one proxy's session (all its clients together) may hold open."""
    proxy_new_queues_per_minute: int = 60_000
    """Queues one proxy token (one proxy session, without an auth file) may create per
    minute for all its clients together."""
    hello_timeout: float = 10.0
    """Seconds a session stream has to send its Hello; then it is ended (PROTOCOL_ERROR)."""

    def __post_init__(self) -> None:
        if not self.hello_timeout > 0:
            raise ValueError("hello_timeout must be > 0")
        rates = ("new_queues_per_minute", "frames_per_second", "confirm_errors_per_second")
        counts = ("max_open_queues", "proxy_max_open_queues", "proxy_new_queues_per_minute")
        for name in (*rates, *counts):
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

    def full(self) -> bool:
        """Whether the bucket holds its whole burst (as a new one would)."""
        self._refill()
        return self._level >= self.burst

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
        self._new_queues: dict[tuple[str, ...], Bucket] = {}

    def session(self, token: str | None) -> SessionGuard:
        """The guard of a session that presented ``token`` (None: none)."""
        grant = ANONYMOUS if self.authorizer is None else self.authorizer.authenticate(token)
        return SessionGuard(self, grant, token is not None)

    def new_queue_bucket(self, *owner: str, proxy: bool = False) -> Bucket:
        """The new-queues-per-minute bucket of a token (or a session), or of a proxy's
        client (``proxy token, client``); ``proxy``: the proxy's own, at the proxy rate."""
        key = ("proxy" if proxy else "client" if len(owner) > 1 else "token", *owner)
        bucket = self._new_queues.get(key)
        if bucket is None:
            limits = self.limits
            per_minute = (
                limits.proxy_new_queues_per_minute if proxy else limits.new_queues_per_minute
            )
            if len(self._new_queues) >= MAX_BUCKETS:
                self._forget_full_buckets()
            bucket = self._new_queues[key] = Bucket(per_minute / 60, per_minute, self._clock)
        return bucket

    def _forget_full_buckets(self) -> None:
        # A full bucket is a new one: dropping it changes no decision, and keeps one
        # bucket per session ever seen (without an auth file) from growing for good.
        for key in [key for key, bucket in self._new_queues.items() if bucket.full()]:
            del self._new_queues[key]

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
        self.relays = False
        """The session is a proxy's, limited by the proxy bounds (``relaying``)."""

    def relaying(self, claimed: bool) -> bool:
        """The client's Hello says whether it relays other clients (``claimed``): a
        proxy's session is limited by the proxy bounds if its token may be a proxy's.
        False when the claim is not granted (the session keeps a client's limits)."""
        self.relays = claimed and self.grant is not None and self.grant.proxy
        return self.relays or not claimed

    def refusal(self) -> str | None:
        """Why the session may not start (no or an unknown token), or None."""
        if self.grant is not None:
            return None
        return "a token is required" if not self._presented else "the token is not valid"

    def check_open(
        self,
        domain: str,
        read: bool,
        write: bool,
        creates: bool,
        session_id: str,
        for_client: str = "",
    ) -> tuple[pb.Status, str] | None:
        """Why an open of a queue of ``domain`` is refused, or None. ``creates``: the
        queue does not exist yet; ``for_client``: the proxy's client it is for (a
        relaying session's). Checks permissions before looking at anything else, so a
        refusal says nothing about which queues exist."""
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
        limits, relays = self._server.limits, self.relays
        if self.open_queues >= (limits.proxy_max_open_queues if relays else limits.max_open_queues):
            whose = "this proxy's session" if relays else "this session"
            return (
                pb.STATUS_LIMIT_EXCEEDED,
                f"{whose} holds {self.open_queues} open queues, the limit",
            )
        if not creates:
            return None
        if relays and for_client:
            client = self._server.new_queue_bucket(self.owner(session_id), for_client)
            if not client.take():
                return (
                    pb.STATUS_LIMIT_EXCEEDED,
                    f"more than {limits.new_queues_per_minute} new queues a minute",
                )
        if not self._new_queue(session_id):
            return (
                pb.STATUS_LIMIT_EXCEEDED,
                f"more than {self._new_queues_per_minute()} new queues a minute",
            )
        return None

    def owner(self, session_id: str) -> str:
        """Whom this session's new queues count against: its token (by name), or the
        session itself without an auth file."""
        grant = self.grant
        return grant.name if grant is not None and self._server.authorizer else session_id

    def _new_queue(self, session_id: str) -> bool:
        """Take one new queue from the budget of this session's token (or session)."""
        return self._server.new_queue_bucket(self.owner(session_id), proxy=self.relays).take()

    def _new_queues_per_minute(self) -> int:
        limits = self.limits
        return limits.proxy_new_queues_per_minute if self.relays else limits.new_queues_per_minute

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
        if not self._new_queue(session_id):
            return (
                pb.STATUS_LIMIT_EXCEEDED,
                f"more than {self._new_queues_per_minute()} new queues a minute "
                f"(the dead-letter notice to {notify} would create one)",
            )
        return None

    def check_original_uri(self, uri: str) -> Refusal | None:
        """Why a PUT naming ``uri`` as its ``x-original-uri`` is refused, or None: a
        replay of the dead-letter queue it sits in would write it there, so the writer
        must be allowed to write that domain itself. An invalid URI is not checked (a
        replay leaves such a message where it is)."""
        try:
            domain = parse_queue_uri(uri).domain
        except Invalid:
            return None
        return self.check_write(domain, f"its {ORIGINAL_URI} {uri[:100]}")

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
    grant = unary_grant(guard, context, admin)
    if not isinstance(grant, Grant):
        return grant
    return None if uri is None else domain_refusal(grant, uri, write)


def unary_grant(guard: ServerGuard, context: Any, admin: bool = False) -> Grant | Refusal:
    """The grant of the token in a unary call's metadata (``ANONYMOUS`` without an auth
    file), or why the call is refused: UNAUTHENTICATED without a valid token,
    PERMISSION_DENIED without ``admin`` for an admin call."""
    if guard.authorizer is None:
        return ANONYMOUS
    metadata = getattr(context, "invocation_metadata", None)
    session = guard.session(bearer_token(metadata() if metadata is not None else None))
    refusal = session.refusal()
    if refusal is not None:
        return pb.STATUS_UNAUTHENTICATED, refusal
    grant = session.grant
    assert grant is not None
    if admin and not grant.admin:
        return pb.STATUS_PERMISSION_DENIED, f"token {grant.name!r} is not an admin token"
    return grant


def domain_refusal(grant: Grant, uri: str, write: bool) -> Refusal | None:
    """Why ``grant`` may not read (``write``: write) the queue ``uri`` or the queues of
    the template ``uri`` (``hf://d/prefix*``), or None; None for an invalid URI too,
    which the call itself answers with INVALID_ARGUMENT."""
    try:
        domain = parse_queue_uri(uri[:-1] if is_template(uri) else uri).domain
    except Invalid:
        return None
    allowed = grant.can_write(domain) if write else grant.can_read(domain)
    if allowed:
        return None
    verb = "write" if write else "read"
    return pb.STATUS_PERMISSION_DENIED, f"token {grant.name!r} may not {verb} {domain!r}"


async def pause(seconds: float) -> None:
    """Pause a session's reading (its budget is spent)."""
    await asyncio.sleep(seconds)


__all__ = [
    "ANONYMOUS",
    "Bucket",
    "Refusal",
    "ServerGuard",
    "SessionGuard",
    "SessionLimits",
    "domain_refusal",
    "pause",
    "unary_grant",
    "unary_refusal",
]

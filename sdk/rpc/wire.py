"""How request/reply travels over queues: reserved properties, GUIDs, message kinds.

A call is ordinary messages, so it inherits the contract (PUTs never lost nor
duplicated, redelivery to another consumer when one goes away):

- the **request** is a PUT on the service queue, under a GUID the caller picks
  (the request GUID), with ``x-rpc-reply-to`` (the caller's reply queue),
  ``x-rpc-expires`` (the wall-clock time, in ms since the epoch, after which no
  worker may start it: the pickup timeout) and ``x-rpc-deadline`` (when the caller
  stops waiting for the reply, likewise);
- the **reply** (``x-rpc-kind: reply`` or ``error``) is a PUT on the reply queue
  whose GUID is derived from the request GUID (``reply_guid``), so two workers
  that both ran the request (one crashed before it confirmed) post the same GUID
  and the broker's dedup keeps one; its pickup TTL (``x-ttl-ms``) lasts until the
  call's deadline plus ``REPLY_TTL_MARGIN``, so a reply its caller will never read
  (the caller died) does not keep the reply queue in the broker for good;
- **heartbeats** (``beat``) go to the reply queue too, while a worker runs the
  request; they name the worker's control queue (``x-rpc-worker``) and its
  heartbeat interval (``x-rpc-beat-ms``), and expire unread after
  ``BEAT_TTL_BEATS`` intervals (``x-ttl-ms``, at least ``MIN_BEAT_TTL_MS``);
- a **cancel** goes to that control queue, with a pickup TTL of ``CANCEL_TTL``
  (``x-ttl-ms``), so a cancel to a worker that died (that never reads its control
  queue again) does not keep that queue in the broker for good.

A **durable** request (``Session.request_durable``) carries ``x-rpc-keep-until``
(ms since the epoch): its reply queue is its own, named from the request GUID
(``durable_reply_uri``), the worker sends no heartbeats for it, and posts the reply
with the broker's pickup TTL (``x-ttl-ms``) set to the time left until then, so the
broker keeps the reply that long and then drops it.

Properties starting with ``x-rpc-`` are reserved: applications may not set them.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from holdfast.proto.policy import DEAD_GUID, DELIVERY_COUNT
from holdfast.proto.uri import parse_queue_uri
from holdfast.proto.validate import DEAD_LETTER_NOTIFY, MAX_PICKUP_TTL_MS, PICKUP_TTL
from holdfast.sdk.errors import (
    DeadLetteredError,
    InvalidPropertiesError,
    RemoteHandlerError,
    RpcError,
    WorkerStartError,
)
from holdfast.sdk.guids import uuid_from_bytes

PREFIX = "x-rpc-"
KIND = "x-rpc-kind"
REQUEST = "x-rpc-request"
REPLY_TO = "x-rpc-reply-to"
EXPIRES = "x-rpc-expires"
KEEP_UNTIL = "x-rpc-keep-until"
"""On a durable request: until when (ms since the epoch) its reply is kept."""
DEADLINE = "x-rpc-deadline"
"""On an ordinary request: when (ms since the epoch) its caller stops waiting."""
POOL = "x-rpc-pool"
"""The pool of a worker that could not start (on a ``worker-start`` error reply)."""
KEY = "x-rpc-key"
"""The pool key of ``Session.request(key=...)``; carried for keyed worker pools (issue 16)."""
WORKER = "x-rpc-worker"
BEAT_MS = "x-rpc-beat-ms"
ERROR = "x-rpc-error"
ERROR_TYPE = "x-rpc-error-type"
DEATH_REASON = "x-death-reason"
"""The dead-letter reason, named as the dead-letter queues name it."""

REPLY = "reply"
FAILURE = "error"
BEAT = "beat"
CANCEL = "cancel"

HANDLER_ERROR = "handler"
DEAD_LETTER = "dead-letter"
WORKER_START = "worker-start"
"""The error kind of a call whose pool worker could not start (``holdfast.pool``)."""

REPLY_TTL_MARGIN = 10.0
"""Seconds a reply is kept past its call's deadline before the broker drops it unread:
room for the clocks of the caller's and the worker's hosts to differ."""
BEAT_TTL_BEATS = 5
"""Heartbeat intervals after which a heartbeat nobody read expires: by then its caller
either read a newer one or presumes the worker lost (after 3 intervals)."""
MIN_BEAT_TTL_MS = 1000
"""The shortest heartbeat TTL, whatever the interval: a beat must outlive its trip."""
CANCEL_TTL = 60.0
"""Seconds a cancel waits unread in a worker's control queue before the broker drops
it. A live worker reads its control queue at once; one cut off longer than this has
lost its requests to other workers (told at their first heartbeat), and one that
died never reads it."""

MAX_ERROR_TEXT = 1000
"""Characters of an error message carried in an error reply."""

_CALL_POLICY = frozenset((PICKUP_TTL, DEAD_LETTER_NOTIFY))
"""Per-message policy properties a call sets (the broker's pickup TTL and notice)."""

_REPLY_NAMESPACE = b"holdfast-rpc-reply/1:"


def reply_guid(request_guid: uuid.UUID) -> uuid.UUID:
    """The GUID of the reply to ``request_guid``: a UUIDv8 (RFC 9562) of a SHA-256.

    Deterministic, so a request run twice (a worker crashed before it confirmed)
    yields one reply at the broker; distinct from every uuid7 request GUID.
    """
    digest = bytearray(hashlib.sha256(_REPLY_NAMESPACE + request_guid.bytes).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x80  # version 8
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 9562 variant
    return uuid_from_bytes(bytes(digest))


def check_user_properties(properties: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of an application's properties; refuse reserved ``x-rpc-`` names and the
    per-message policy properties the call sets itself."""
    result = dict(properties or {})
    for name in result:
        if not isinstance(name, str):
            continue
        if name in _CALL_POLICY:  # not under PREFIX: the broker's names, named as such
            raise InvalidPropertiesError(
                f"property {name!r} is reserved: request/reply sets it on its messages"
            )
        if name.startswith(PREFIX):
            raise InvalidPropertiesError(
                f"property {name[:64]!r}: names starting with {PREFIX!r} are reserved"
            )
    return result


def user_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The application's properties of a request or reply (reserved ones removed)."""
    return {
        k: v for k, v in properties.items() if not k.startswith(PREFIX) and k not in _CALL_POLICY
    }


def wall_ms() -> int:
    """Now, in milliseconds since the epoch (pickup deadlines cross hosts)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """What a worker reads from a request's reserved properties."""

    reply_to: str
    expires_ms: int
    keep_until_ms: int = 0
    """A durable request's ``x-rpc-keep-until``; 0 for an ordinary call."""


def parse_request(properties: Mapping[str, str]) -> RequestHeader:
    """Read a request's header; ``ValueError`` naming what is wrong (bounded)."""
    reply_to = properties.get(REPLY_TO, "")
    parse_queue_uri(reply_to)
    raw = properties.get(EXPIRES, "0")
    try:
        expires = int(raw)
    except ValueError:
        raise ValueError(f"{EXPIRES} is not an integer: {raw[:32]!r}") from None
    keep = properties.get(KEEP_UNTIL, "0")
    if not keep.isdigit():
        raise ValueError(f"{KEEP_UNTIL} is not a whole number: {keep[:32]!r}")
    return RequestHeader(reply_to, expires, int(keep))


REPLY_QUEUE_PREFIX = "rpc-reply-"
"""A caller's reply queue is ``hf://<service domain>/rpc-reply-<32 hex>`` (one per
session and domain: ``Caller``); a durable request's is ``durable_reply_uri``."""

_REPLY_QUEUE = re.compile(re.escape(REPLY_QUEUE_PREFIX) + "[0-9a-f]{32}")


def check_reply_to(header: RequestHeader, domain: str, request_guid: uuid.UUID) -> None:
    """``ValueError`` saying why a worker of a service in ``domain`` must not answer
    the request ``request_guid`` in the queue it names.

    The broker checks that a caller may write the service's queue, never the
    ``x-rpc-reply-to`` it names: a worker that posted there with its own token would
    write, for the caller, into a queue (a domain) the caller may not write (a
    confused deputy). The SDK's callers always name a reply queue of the service's own
    domain, ``rpc-reply-<32 hex>``, or for a durable request the queue named from its
    GUID; anything else was not written by this SDK and is refused."""
    reply_to = header.reply_to
    parsed = parse_queue_uri(reply_to)
    if parsed.domain != domain:
        raise ValueError(
            f"its reply queue {reply_to[:200]!r} is outside the service's domain {domain!r}"
        )
    if header.keep_until_ms > 0:
        expected = durable_reply_uri(domain, request_guid)
        if reply_to != expected:
            raise ValueError(
                f"its reply queue {reply_to[:200]!r} is not its durable reply queue {expected}"
            )
    elif not _REPLY_QUEUE.fullmatch(parsed.queue):
        raise ValueError(
            f"its reply queue {reply_to[:200]!r} is not a caller's reply queue "
            f"(hf://{domain}/{REPLY_QUEUE_PREFIX}<32 hex>)"
        )


def parse_request_guid(properties: Mapping[str, str]) -> uuid.UUID | None:
    """The request GUID a reply-queue or control message is about (None if unreadable):
    ``x-rpc-request``, or ``x-dead-guid`` on the broker's dead-letter notice."""
    try:
        return uuid.UUID(hex=properties.get(REQUEST) or properties.get(DEAD_GUID, ""))
    except ValueError:
        return None


def request_key(properties: Mapping[str, str]) -> bytes | None:
    """The 16 bytes of the request GUID ``parse_request_guid`` reads (None if
    unreadable), without making a ``UUID``: callers and workers look calls up by these
    bytes, once per reply-queue or control message."""
    text = properties.get(REQUEST) or properties.get(DEAD_GUID, "")
    if len(text) == 32:  # the plain hex the SDK and the broker write
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) == 16:  # 32 hex digits, nothing else: what UUID(hex=) reads too
            return key
    guid = parse_request_guid(properties)  # any other spelling UUID(hex=) accepts
    return None if guid is None else guid.bytes


def dead_letter_text(properties: Mapping[str, str]) -> str:
    """What the broker's dead-letter notice says, for the caller's error."""
    return (
        f"the broker dead-lettered the request ({properties.get(DEATH_REASON, 'unknown')[:64]}) "
        f"after {properties.get(DELIVERY_COUNT, '?')[:12]} deliveries"
    )


def broker_pickup_ms(pickup: float) -> int:
    """The pickup TTL the broker enforces for a call whose pickup timeout is ``pickup``
    seconds: a margin under the caller's own pickup deadline (a quarter of it, at most
    1 s), so the broker's notice, with its reason, normally arrives before the caller's
    timer gives up on its own."""
    return max(1, round((pickup - min(pickup / 4, 1.0)) * 1000))


def request_properties(
    user: dict[str, str],
    reply_to: str,
    expires_ms: int,
    key: str | None,
    pickup_ms: int = 0,
    keep_until_ms: int = 0,
    deadline_ms: int = 0,
) -> dict[str, str]:
    """The properties of a request PUT. With ``pickup_ms`` the broker itself
    dead-letters the request if no worker takes it within that time, and tells the
    caller's reply queue (``PICKUP_TTL``, ``DEAD_LETTER_NOTIFY``); it also tells it when
    the service queue's delivery limit dead-letters the request."""
    properties = dict(user)
    properties[REPLY_TO] = reply_to
    properties[EXPIRES] = str(expires_ms)
    properties[DEAD_LETTER_NOTIFY] = reply_to
    if pickup_ms > 0:
        properties[PICKUP_TTL] = str(pickup_ms)
    if key is not None:
        properties[KEY] = key
    if keep_until_ms > 0:
        properties[KEEP_UNTIL] = str(keep_until_ms)
    if deadline_ms > 0:
        properties[DEADLINE] = str(deadline_ms)
    return properties


def durable_reply_uri(domain: str, request_guid: uuid.UUID) -> str:
    """The reply queue of a durable request: its own, named from its GUID, so any
    session can find the reply from the request id alone."""
    return f"hf://{domain}/rpc-durable-{request_guid.hex}"


def kept_reply(properties: Mapping[str, str], keep_until_ms: int) -> dict[str, str] | None:
    """A durable reply's properties with the broker's pickup TTL set to the time left
    until ``keep_until_ms``; None once that time has passed (nobody may fetch it)."""
    left = keep_until_ms - wall_ms()
    if left <= 0:
        return None
    kept = dict(properties)
    kept[PICKUP_TTL] = str(left)
    return kept


def expiring_reply(properties: Mapping[str, str], request: Mapping[str, str]) -> dict[str, str]:
    """An ordinary call's reply properties with the broker's pickup TTL set to the time
    left until the request's ``x-rpc-deadline`` plus ``REPLY_TTL_MARGIN``: unread by
    then, its caller is gone, and the reply would keep the reply queue in the broker
    for good. A request without a readable deadline (an older caller's) gets none."""
    deadline = request.get(DEADLINE, "")
    if not deadline.isdigit():
        return dict(properties)
    left = max(int(deadline) - wall_ms(), 0) + round(REPLY_TTL_MARGIN * 1000)
    return {**properties, PICKUP_TTL: str(min(left, MAX_PICKUP_TTL_MS))}


def reply_properties(request_guid: uuid.UUID, user: Mapping[str, str]) -> dict[str, str]:
    """The properties of a successful reply."""
    properties = dict(user)
    properties[KIND] = REPLY
    properties[REQUEST] = request_guid.hex
    return properties


def error_properties(
    request_guid: uuid.UUID, error: str, error_type: str, reason: str = ""
) -> dict[str, str]:
    """The properties of an error reply (``error`` is ``handler``, ``dead-letter`` or
    ``worker-start``)."""
    properties = {KIND: FAILURE, REQUEST: request_guid.hex, ERROR: error, ERROR_TYPE: error_type}
    if reason:
        properties[DEATH_REASON] = reason
    return properties


def beat_properties(request_guid: uuid.UUID, worker: str, interval: float) -> dict[str, str]:
    """The properties of a heartbeat."""
    beat_ms = max(1, round(interval * 1000))
    return {
        KIND: BEAT,
        REQUEST: request_guid.hex,
        WORKER: worker,
        BEAT_MS: str(beat_ms),
        PICKUP_TTL: str(max(MIN_BEAT_TTL_MS, BEAT_TTL_BEATS * beat_ms)),
    }


def cancel_properties(request_guid: uuid.UUID) -> dict[str, str]:
    """The properties of a cancel sent to a worker's control queue (expiring unread
    after ``CANCEL_TTL``)."""
    return {KIND: CANCEL, REQUEST: request_guid.hex, PICKUP_TTL: str(round(CANCEL_TTL * 1000))}


def error_text(error: BaseException, limit: int = MAX_ERROR_TEXT) -> str:
    """An exception's message for the wire: bounded to ``limit`` characters, and always
    encodable. The message may hold a lone surrogate (``os.fsdecode`` of a file name
    that is not UTF-8, as ``os.listdir`` gives it), which UTF-8 refuses, and an
    exception's ``__str__`` may itself raise; either made the error reply fail to
    build, so the call was never answered and held its worker's slot for good."""
    try:
        text = str(error)
    except Exception as failure:  # a broken __str__ must not cost the caller its answer
        text = f"<{type(error).__name__}: str() raised {type(failure).__name__}>"
    return wire_text(text[: limit * 4])[:limit]


def wire_text(text: str) -> str:
    """``text`` with whatever UTF-8 cannot encode (lone surrogates) escaped
    (``backslashreplace``), so that it can travel as a payload or a property."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def remote_error(properties: Mapping[str, str], payload: bytes) -> RpcError:
    """The caller's error for an error reply."""
    text = payload[:MAX_ERROR_TEXT].decode("utf-8", "replace")
    if properties.get(ERROR) == DEAD_LETTER:
        return DeadLetteredError(properties.get(DEATH_REASON, "unknown")[:64], text)
    if properties.get(ERROR) == WORKER_START:  # bounded by the broker's limits
        return WorkerStartError(properties.get(POOL, ""), properties.get(KEY, ""), text)
    return RemoteHandlerError(properties.get(ERROR_TYPE, "Exception")[:128], text)


def payload_bytes(value: object) -> bytes:
    """A handler's reply payload as bytes: a bytes-like object; an ``int`` is refused
    (``bytes(42)`` would answer 42 zero bytes), as is anything ``bytes()`` refuses."""
    if isinstance(value, int):
        raise TypeError(f"a handler returned {type(value).__name__}, not bytes")
    return bytes(value)  # type: ignore[call-overload,no-any-return]

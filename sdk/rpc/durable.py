"""Durable requests, replies fetched by id (the ZeroMQ guide's Titanic pattern).

``session.request_durable(uri, payload)`` posts a request, waits for the broker's
ACK, and returns its **request id**, a ``str``::

    <domain>/<request GUID hex>/<keep-until, ms since the epoch>/<check>

The reply goes to a queue of its own in the broker, ``hf://<domain>/rpc-durable-<GUID
hex>`` (``wire.durable_reply_uri``), posted by the worker with the broker's pickup TTL
set to the time left until *keep-until* (``keep`` seconds after the request,
``DEFAULT_REPLY_KEEP`` by default): the broker keeps it that long, durably with a
durable store, and then drops it (at its next sweep, a fraction of a second
later). ``session.fetch_reply(request_id, timeout)`` reads it from any session of
the same token, in this process or another one (the caller may have restarted):
a ``Reply``, or the call's own ``RpcError`` (``RemoteHandlerError``,
``DeadLetteredError``). Fetching does not use the reply up: it stays fetchable until
*keep-until* (a fresh copy is posted before the delivered one is confirmed). Its data
streams are sent once, so they go to the first fetch that returns it; the copy it
keeps says so (``chunks.TAKEN``), and a later fetch's streams raise
``StreamTakenError`` on read (``with_streams``).

Past *keep-until* ``fetch_reply`` raises ``ReplyExpiredError``, at once, or when the
wait reaches it; before, a reply that has not come within ``timeout`` is
``RpcTimeoutError`` (fetch again later). An id that is not one issued to a session of
this token (malformed, altered: *check* is an HMAC of the rest under the token) is
``UnknownRequestError``, once the server has answered a question of the session
(``has_workers``): a session it refuses (no token, or one it does not know) gets its
``AuthenticationError``, as every other call does (``session_refused``). The keep
time rests on the wall clocks of the caller and the worker (NTP-level agreement is
assumed).

The request itself carries the same keep time as its pickup TTL, so no worker starts
it once its reply could no longer be fetched, and its reply queue as the broker's
dead-letter notice queue (a request dead-lettered at the delivery limit is fetched as
``DeadLetteredError``). The broker gives that notice the request's pickup TTL (its
keep time, counted from the dead-lettering), so a notice nobody fetches expires too.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import queue as stdqueue
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from holdfast.sdk import tracing
from holdfast.sdk.errors import (
    AuthenticationError,
    HoldfastError,
    InvalidArgumentError,
    ReplyExpiredError,
    RequestRefusedError,
    RequestTimeoutError,
    RpcError,
    RpcTimeoutError,
    SessionClosedError,
    UnknownRequestError,
)
from holdfast.sdk.instrument import Untraced
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import calls, chunks, wire
from holdfast.sdk.rpc import streams as streaming
from holdfast.sdk.rpc.values import Reply
from holdfast.sdk.types import Ack, AckStatus, Message

if TYPE_CHECKING:
    from holdfast.sdk.rpc.caller import Caller
    from holdfast.sdk.session import Session

DEFAULT_REPLY_KEEP = 3600.0
"""Seconds a durable request's reply is kept by default (``keep=``)."""

MAX_REPLY_KEEP = 30 * 86400.0
"""The longest ``keep=`` accepted (thirty days)."""

_ID = re.compile(
    r"(?P<domain>[A-Za-z0-9][A-Za-z0-9._-]{0,127})/(?P<guid>[0-9a-f]{32})"
    r"/(?P<until>[0-9]{1,16})/(?P<check>[0-9a-f]{32})"
)

ONE_AT_A_TIME = QueueOptions(max_unconfirmed_messages=1)
NO_MORE = QueueOptions(max_unconfirmed_messages=0)
"""Set before a fetched reply is confirmed, so its fresh copy is not delivered."""


@dataclass(frozen=True, slots=True)
class RequestId:
    """A parsed request id (see the module docstring)."""

    domain: str
    guid: uuid.UUID
    keep_until_ms: int

    @property
    def body(self) -> str:
        """The id without its check."""
        return f"{self.domain}/{self.guid.hex}/{self.keep_until_ms}"

    def text(self, token: str | None) -> str:
        """The id as ``request_durable`` returns it."""
        return f"{self.body}/{_check(self.body, token)}"

    @property
    def reply_uri(self) -> str:
        """The queue its reply goes to."""
        return wire.durable_reply_uri(self.domain, self.guid)


def parse_request_id(text: object, token: str | None) -> RequestId:
    """``text`` as a request id of ``token``; ``UnknownRequestError`` otherwise
    (``InvalidArgumentError`` if it is not even a ``str``: a programming error, not an
    id the broker forgot)."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"a request id is a str, not {type(text).__name__}")
    match = _ID.fullmatch(text)
    if match is None:
        raise UnknownRequestError(f"not a request id: {str(text)[:120]!r}")
    parsed = RequestId(match["domain"], uuid.UUID(hex=match["guid"]), int(match["until"]))
    if not hmac.compare_digest(match["check"], _check(parsed.body, token)):
        raise UnknownRequestError(
            f"request id {parsed.body[:120]!r} was not issued to a session of this token"
        )
    return parsed


def _check(body: str, token: str | None) -> str:
    key = (token or "").encode()
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class DurablePut:
    """A durable request ready to post: its id (parsed and as text) and properties."""

    rid: RequestId
    text: str
    properties: dict[str, str]


def prepare(
    domain: str,
    guid: uuid.UUID,
    properties: Mapping[str, str] | None,
    key: str | None,
    keep: float,
    timeout: float,
    token: str | None,
) -> DurablePut:
    """Check the arguments of ``request_durable``; the request to post."""
    calls.check_seconds("keep", keep, most=MAX_REPLY_KEEP)
    calls.check_seconds("timeout", timeout)
    user = wire.check_user_properties(properties)
    keep_ms = max(1, round(keep * 1000))
    rid = RequestId(domain, guid, wire.wall_ms() + keep_ms)
    request = wire.request_properties(
        user, rid.reply_uri, rid.keep_until_ms, key, keep_ms, rid.keep_until_ms
    )
    return DurablePut(rid, rid.text(token), request)


def check_ack(put: DurablePut, ack: Ack | None, timeout: float) -> str:
    """The request id once the broker ACKed it; the typed error otherwise (``ack``
    None: no ACK within ``timeout``)."""
    if ack is None:
        raise RpcTimeoutError(
            f"the broker has not ACKed durable request {put.text} within {timeout} s; "
            "the session still retries it: fetch_reply may find its reply"
        )
    if not ack.status.ok:
        maybe = " (it may or may not be enqueued)" if ack.status is AckStatus.UNKNOWN else ""
        raise RequestRefusedError(ack.status.value, f"durable request {put.text}{maybe}")
    return put.text


def wait_left(rid: RequestId, deadline: float) -> float:
    """Seconds ``fetch_reply`` may still wait (> 0); else its typed error:
    ``ReplyExpiredError`` past the keep time, ``RpcTimeoutError`` past ``deadline``."""
    keep_left = (rid.keep_until_ms - wire.wall_ms()) / 1000
    left = min(deadline - time.monotonic(), keep_left)
    if left > 0:
        return left
    if keep_left <= 0:
        raise expired(rid)
    raise RpcTimeoutError(f"no reply to durable request {rid.body} yet; fetch it again later")


FETCH_LOOK = 0.5
"""Seconds a fetch with ``timeout=0`` still waits for the broker to deliver a reply it
holds (the delivery follows the open's answer, it does not come with it)."""


def fetch_deadline(timeout: float) -> float:
    """When a fetch of ``timeout`` seconds gives up (monotonic): ``timeout=0`` looks at
    what the broker holds, for at most ``FETCH_LOOK``."""
    return time.monotonic() + max(timeout, FETCH_LOOK)


def not_fetched(rid: RequestId, timeout: float, error: Exception) -> RpcTimeoutError:
    """The error of a fetch that could not open the reply's queue within ``timeout``."""
    return RpcTimeoutError(
        f"could not look for the reply to durable request {rid.body} within {timeout} s "
        f"({error}); fetch it again later"
    )


def start_fetch(request_id: str, token: str | None, timeout: float) -> RequestId:
    """Check the arguments of ``fetch_reply``; ``ReplyExpiredError`` at once if past."""
    calls.check_seconds("timeout", timeout, zero=True)
    rid = parse_request_id(request_id, token)
    if wire.wall_ms() >= rid.keep_until_ms:
        raise expired(rid)
    return rid


def probe_uri(request_id: object) -> str:
    """The queue ``fetch_reply`` asks the server about (``has_workers``) before it
    calls an id unknown: one of the id's domain, or of ``holdfast`` if it has none."""
    match = _ID.fullmatch(request_id) if isinstance(request_id, str) else None
    return f"hf://{match['domain'] if match else 'holdfast'}/rpc-fetch-probe"


def probe_timeout(timeout: float) -> float:
    """How long that question may take: the fetch's ``timeout`` (``FETCH_LOOK`` for 0)."""
    return max(timeout, FETCH_LOOK)


def session_refused(error: HoldfastError) -> bool:
    """True if ``error``, raised by the probe of an id that failed its check, says the
    server refuses this session (its ``AuthenticationError``: no token, or one it does
    not know; or the session already ended): that is reported, as by every other call,
    not an unknown id, since an id fails its check under a missing or wrong token too.
    Any other answer (a refusal of the probe for its domain, no answer in time) leaves
    the id unknown."""
    return isinstance(error, AuthenticationError | SessionClosedError)


def post_durable(
    caller: Caller,
    uri: str,
    payload: bytes,
    *,
    properties: Mapping[str, str] | None,
    key: str | None,
    keep: float,
    timeout: float,
) -> str:
    """Post a durable request and wait for the broker's ACK; its request id."""
    caller.refuse_on_dispatcher("request_durable")
    deadline = calls.deadlines(timeout, None)[0]
    try:  # within the call's timeout, also while the broker is unreachable
        target, domain = caller.target(uri, key, calls.left(deadline))
    except RequestTimeoutError as error:
        raise calls.open_timed_out(uri, timeout, error) from None
    put = prepare(domain, caller.next_guid(), properties, key, keep, timeout, caller.token)
    acked: concurrent.futures.Future[Ack] = concurrent.futures.Future()
    target.post(payload, put.properties, acked.set_result, guid=put.rid.guid)
    try:
        ack: Ack | None = acked.result(calls.left(deadline))
    except concurrent.futures.TimeoutError:
        ack = None
    return check_ack(put, ack, timeout)


def with_streams(
    reply: Reply,
    message: Message,
    guid: uuid.UUID,
    readers: Callable[[str, uuid.UUID, Mapping[str, str]], Mapping[str, Any]],
    taken: Callable[[str], Any],
) -> Reply:
    """``reply`` with readers of the data streams its message announces, made by
    ``readers(domain, reply GUID, properties)`` on the fetcher's session (threaded or
    asyncio), as a call's reply has. They were dropped: the worker's sender then
    waited for credit that never came, and the chunks stayed in the broker. A stream
    is sent once, so the first fetch that returns the reply takes its streams; a later
    fetch gets the copy that fetch kept, marked ``chunks.TAKEN``, and ``taken(name)``
    readers that raise ``StreamTakenError`` at once (readers of the stream would wait
    for chunks already read until their stall timeout)."""
    if chunks.NAMES not in message.properties:
        return reply
    streams: Mapping[str, Any]
    if chunks.TAKEN in message.properties:
        streams = {name: taken(name) for name in chunks.parse_names(message.properties)}
    else:
        domain = calls.domain_of(message.queue_uri)
        streams = readers(domain, wire.reply_guid(guid), message.properties)
    return dataclasses.replace(reply, streams=streams)


def kept_copy(message: Message, rid: RequestId) -> dict[str, str] | None:
    """The properties of the fresh copy a fetch posts of the reply it takes
    (``wire.kept_reply``), marked ``chunks.TAKEN`` if the reply has streams: this
    fetch takes them. None past the keep time."""
    kept = wire.kept_reply(message.properties, rid.keep_until_ms)
    if kept is not None and chunks.NAMES in kept:
        kept[chunks.TAKEN] = "1"
    return kept


def fetch(session: Session, token: str | None, request_id: str, timeout: float) -> Reply:
    """The reply of a durable request (see the module docstring)."""
    try:
        rid = start_fetch(request_id, token, timeout)
    except UnknownRequestError:
        try:  # is it the id, or this session the server refuses? (``session_refused``)
            session.has_workers(probe_uri(request_id), timeout=probe_timeout(timeout))
        except HoldfastError as error:
            if session_refused(error):
                raise
        raise
    deadline = fetch_deadline(timeout)
    inbox: stdqueue.SimpleQueue[Message] = stdqueue.SimpleQueue()
    try:  # within the fetch's timeout, also while the broker is unreachable
        queue = session.open_queue(
            rid.reply_uri,
            read=True,
            write=True,
            on_message=Untraced(inbox.put),  # request/reply's own message: no process span
            options=ONE_AT_A_TIME,
            timeout=calls.left(deadline),
        )
    except RequestTimeoutError as error:
        raise not_fetched(rid, timeout, error) from None
    try:
        while True:
            try:
                message = inbox.get(timeout=wait_left(rid, deadline))
            except stdqueue.Empty:
                continue
            outcome = calls.outcome(rid.guid, message)
            if outcome is None:  # not an answer (a stray heartbeat): drop it
                _confirm(message)
                continue
            _keep_fetchable(queue, message, rid, deadline)
            if isinstance(outcome, RpcError):
                raise outcome
            return with_streams(
                outcome,
                message,
                rid.guid,
                functools.partial(streaming.readers, session),
                streaming.TakenReader,
            )
    finally:
        # the reply, if held, returns to the queue with the connection
        with contextlib.suppress(HoldfastError):
            queue.close(timeout=5)


def _keep_fetchable(queue: Queue, message: Message, rid: RequestId, deadline: float) -> None:
    """Post a fresh copy of the reply (its pickup TTL still running), then confirm the
    delivered one, which the broker no longer expires. The queue takes no more
    deliveries first, so the copy stays undelivered, and expires on time."""
    kept = kept_copy(message, rid)
    if kept is not None:
        acked = threading.Event()
        ok: list[bool] = []

        def on_ack(ack: Ack) -> None:
            ok.append(ack.status.ok)
            acked.set()

        try:
            with tracing.suppressed():  # the SDK's own copy of the reply: no send span
                queue.post(message.payload, kept, on_ack)
        except HoldfastError:
            return  # not copied: the delivered one stays (returned when the queue closes)
        if not (acked.wait(max(1.0, deadline - time.monotonic())) and all(ok)):
            return
    try:
        queue.configure(NO_MORE, timeout=5)
    except HoldfastError:
        return
    _confirm(message)


def _confirm(message: Message) -> None:
    with contextlib.suppress(HoldfastError):  # returned to the queue: fetchable again
        message.confirm()


def expired(rid: RequestId) -> ReplyExpiredError:
    """The error of a fetch past the keep time of ``rid``."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rid.keep_until_ms / 1000))
    return ReplyExpiredError(
        f"the reply to durable request {rid.body} was kept until {when} and is gone"
    )

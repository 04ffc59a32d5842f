"""The values request/reply hands to applications: ``Reply`` and ``Request``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from holdfast.sdk.rpc.cancel import CancelFlag


@dataclass(frozen=True, slots=True)
class Reply:
    """The one reply to a ``Session.request`` call."""

    payload: bytes
    """What the handler returned."""
    properties: Mapping[str, str]
    """Properties the handler returned (reserved ``x-rpc-`` ones removed)."""
    request_guid: uuid.UUID
    """The GUID of the request this answers."""
    streams: Mapping[str, Any] = field(default_factory=dict)
    """The reply's data streams by name, when the handler returned a
    ``StreamingReply``: ``holdfast.sdk.rpc.streams.StreamReader`` objects (``read(n)``),
    or on the asyncio ``Session`` ``holdfast.sdk.aio.streams.AsyncStreamReader`` objects
    (``async for``, ``await read(n)``)."""


@dataclass(slots=True, eq=False)
class Request:
    """One request, as a ``Worker``'s handler receives it."""

    payload: bytes
    """The caller's payload."""
    properties: Mapping[str, str]
    """The caller's properties (reserved ``x-rpc-`` ones removed)."""
    guid: uuid.UUID
    """The request GUID (the same on every redelivery; replies are kept by it)."""
    key: str | None = None
    """The caller's ``key=`` (for keyed worker pools), if any."""
    delivery_count: int = 1
    """1 on first delivery, more when the request was redelivered (a worker died)."""
    cancelled: CancelFlag = field(default_factory=CancelFlag)
    """Set when the caller cancelled, timed out or went away: the handler may stop
    early (``request.cancelled.wait(t)``, ``is_set()``, as a ``threading.Event``);
    its reply is then dropped."""
    streams: Mapping[str, Any] = field(default_factory=dict)
    """The request's data streams by name (``session.request(..., streams=...)``):
    ``holdfast.sdk.rpc.streams.StreamReader`` objects, binary file-like (``read(n)``);
    in the asyncio ``Worker``, ``holdfast.sdk.aio.streams.AsyncStreamReader`` objects
    (``async for chunk in stream``, ``await stream.read(n)``)."""


@dataclass(frozen=True, slots=True)
class StreamingReply:
    """What a ``Worker``'s handler returns to answer with data streams: the caller gets
    ``payload`` and ``properties`` as ``Reply`` and reads each of ``streams`` (binary
    file-like objects with ``read(n)``; for the asyncio ``Worker``, async iterables of
    bytes too) as ``reply.streams[name]``.

    ::

        async def handle(request: Request) -> StreamingReply:  # holdfast.sdk.aio.Worker
            size = 0
            async for chunk in request.streams["upload"]:
                size += len(chunk)
            return StreamingReply(b"%d" % size, {}, {"report": open("report.txt", "rb")})
    """

    payload: bytes
    """The reply payload."""
    properties: Mapping[str, str] = field(default_factory=dict)
    """The reply properties."""
    streams: Mapping[str, Any] = field(default_factory=dict)
    """Stream name -> binary file-like object (or, from the asyncio ``Worker``, async
    iterable of bytes), sent after the handler returned."""

"""The values request/reply hands to applications: ``Reply`` and ``Request``."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Reply:
    """The one reply to a ``Session.request`` call."""

    payload: bytes
    """What the handler returned."""
    properties: Mapping[str, str]
    """Properties the handler returned (reserved ``x-rpc-`` ones removed)."""
    request_guid: uuid.UUID
    """The GUID of the request this answers."""


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
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when the caller cancelled, timed out or went away: the handler may stop
    early (``request.cancelled.wait(t)``, ``is_set()``); its reply is then dropped."""
    streams: Mapping[str, Any] = field(default_factory=dict)
    """The request's data streams by name (``session.request(..., streams=...)``):
    ``holdfast.sdk.rpc.streams.StreamReader`` objects, binary file-like (``read(n)``)."""

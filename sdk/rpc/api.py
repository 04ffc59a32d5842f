"""``Session``'s request/reply methods, as a mixin so the session module stays the
connection's shell: ``request``, ``request_async``, ``request_durable``,
``fetch_reply`` (``has_workers`` asks the engine, so it lives in ``Session``)."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from holdfast.sdk.errors import SessionClosedError
from holdfast.sdk.events import DataLost, SessionEvent
from holdfast.sdk.rpc import durable
from holdfast.sdk.rpc.caller import Caller
from holdfast.sdk.rpc.streams import Readable
from holdfast.sdk.rpc.values import Reply

if TYPE_CHECKING:
    from holdfast.sdk.session import Session

_CREATING = threading.Lock()
"""Guards the creation of a session's ``Caller`` (once per session, rare)."""


class RequestReply:
    """Request/reply for ``Session`` (see ``holdfast.sdk.rpc``)."""

    _caller: Caller | None = None
    _rpc_closed = False

    def request(
        self,
        uri: str,
        payload: bytes,
        *,
        properties: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        key: str | None = None,
        pickup_timeout: float | None = None,
        streams: Mapping[str, Readable] | None = None,
    ) -> Reply:
        """Call the service whose workers consume ``uri``; block for its one reply.

        Raises an ``RpcError``: ``RpcTimeoutError`` (``WorkerLostError`` if its
        worker stopped heartbeating), ``DeadLetteredError`` (reason ``expired``:
        not picked up within ``pickup_timeout``, default ``timeout``),
        ``RemoteHandlerError``, ``RpcCancelledError``. With ``key`` the request goes to
        the key's queue of the keyed worker pool ``uri`` (``holdfast.sdk.pool``) and
        carries the key as ``x-rpc-key``. ``streams`` maps names to binary file-like
        objects sent to the handler as ``request.streams[name]`` (``StreamError`` if
        one cannot complete). See ``holdfast.sdk.rpc``.
        """
        return self._rpc().call(
            uri,
            payload,
            properties=properties,
            timeout=timeout,
            key=key,
            pickup_timeout=pickup_timeout,
            streams=streams,
        )

    def request_async(
        self,
        uri: str,
        payload: bytes,
        *,
        properties: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        key: str | None = None,
        pickup_timeout: float | None = None,
        streams: Mapping[str, Readable] | None = None,
    ) -> concurrent.futures.Future[Reply]:
        """``request`` without blocking: a future for the reply (``cancel()`` tells
        the worker to stop)."""
        return self._rpc().call_async(
            uri,
            payload,
            properties=properties,
            timeout=timeout,
            key=key,
            pickup_timeout=pickup_timeout,
            streams=streams,
        )

    def request_durable(
        self,
        uri: str,
        payload: bytes,
        *,
        properties: Mapping[str, str] | None = None,
        key: str | None = None,
        keep: float = durable.DEFAULT_REPLY_KEEP,
        timeout: float = 30.0,
    ) -> str:
        """Post a durable request; return its request id (a ``str``) once the broker
        has ACKed it (``timeout`` seconds at most, else ``RpcTimeoutError``).

        Its reply is kept in the broker for ``keep`` seconds from now, for
        ``fetch_reply`` from any session of the same token, in this process or
        another. No worker starts the request after that. See
        ``holdfast.sdk.rpc.durable``.
        """
        return durable.post_durable(
            self._rpc(),
            uri,
            payload,
            properties=properties,
            key=key,
            keep=keep,
            timeout=timeout,
        )

    def fetch_reply(self, request_id: str, timeout: float = 30.0) -> Reply:
        """The reply of the durable request ``request_id``, waiting up to ``timeout``
        seconds for it; it stays fetchable until its keep time ends.

        Raises the call's own ``RpcError`` (``RemoteHandlerError``,
        ``DeadLetteredError``), ``RpcTimeoutError`` if no reply came yet,
        ``ReplyExpiredError`` past the keep time, ``UnknownRequestError`` for an id
        not issued to a session of this token (``AuthenticationError`` if the server
        refuses this session's token, or its lack of one).
        """
        caller = self._rpc()
        caller.refuse_on_dispatcher("fetch_reply")
        return durable.fetch(cast("Session", self), caller.token, request_id, timeout)

    def _rpc(self) -> Caller:
        with _CREATING:
            if self._rpc_closed:
                raise SessionClosedError("the session is closed")
            if self._caller is None:
                self._caller = Caller(cast("Session", self))
            return self._caller

    def _rpc_event(self, event: SessionEvent) -> None:
        """Session events that end calls: a store that lost data (``CallLostError``)."""
        caller = self._caller
        if caller is not None and isinstance(event, DataLost) and event.queue_uri is None:
            caller.store_lost(event.message)

    def _close_rpc(self) -> None:
        """Cancel the calls still waiting (the session is closing)."""
        with _CREATING:
            self._rpc_closed = True
            caller = self._caller
        if caller is not None:
            caller.close()

"""``Session``'s request/reply methods, as a mixin so the session module stays the
connection's shell: ``request``, ``request_async`` (``has_workers`` asks the engine,
so it lives in ``Session``)."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from holdfast.sdk.errors import SessionClosedError
from holdfast.sdk.rpc.caller import Caller
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
    ) -> Reply:
        """Call the service whose workers consume ``uri``; block for its one reply.

        Raises an ``RpcError``: ``RpcTimeoutError`` (``WorkerLostError`` if its
        worker stopped heartbeating), ``DeadLetteredError`` (reason ``expired``:
        not picked up within ``pickup_timeout``, default ``timeout``),
        ``RemoteHandlerError``, ``RpcCancelledError``. With ``key`` the request goes to
        the key's queue of the keyed worker pool ``uri`` (``holdfast.sdk.pool``) and
        carries the key as ``x-rpc-key``. See ``holdfast.sdk.rpc``.
        """
        return self._rpc().call(
            uri,
            payload,
            properties=properties,
            timeout=timeout,
            key=key,
            pickup_timeout=pickup_timeout,
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
        )

    def _rpc(self) -> Caller:
        with _CREATING:
            if self._rpc_closed:
                raise SessionClosedError("the session is closed")
            if self._caller is None:
                self._caller = Caller(cast("Session", self))
            return self._caller

    def _close_rpc(self) -> None:
        """Cancel the calls still waiting (the session is closing)."""
        with _CREATING:
            self._rpc_closed = True
            caller = self._caller
        if caller is not None:
            caller.close()

"""``await session.request(...)`` on the asyncio ``Session``.

The caller (``holdfast.sdk.rpc.caller.Caller``) is written against the synchronous
session's blocking surface: ``open_queue`` that returns an open queue, ``post`` that
returns a GUID, ``close``. ``BlockingView`` gives it that surface over an asyncio
session by running each coroutine on the session's loop from the caller's own
threads; the asyncio front-end calls the caller from an executor thread (never the
loop, which the view needs free) and awaits the reply future with
``asyncio.wrap_future``. Reply messages are handled on the loop, like every
callback of the asyncio session; the caller only takes a lock there.

One caller, one set of call rules (heartbeats, cancels, pickup, dead-letter
notices) for both APIs.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from holdfast.sdk.types import Ack

if TYPE_CHECKING:
    from holdfast.sdk.aio.queue import Queue
    from holdfast.sdk.aio.session import Session

T = TypeVar("T")


class _LoopThread:
    """Tells the caller whether it runs on the loop (where it must not block)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread_id = threading.get_ident()

    def in_dispatcher(self) -> bool:
        """True on the session's loop thread: a blocking call there would deadlock."""
        return threading.get_ident() == self._thread_id


class BlockingQueue:
    """A queue of an asyncio session, used from a thread that is not the loop."""

    def __init__(self, view: BlockingView, queue: Queue) -> None:
        self._view = view
        self._queue = queue

    @property
    def uri(self) -> str:
        """The queue's URI."""
        return self._queue.uri

    @property
    def is_open(self) -> bool:
        """Whether the queue is open."""
        return self._queue.is_open

    def post(
        self,
        payload: bytes,
        properties: Mapping[str, str] | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
        *,
        guid: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """``await queue.post(...)`` on the loop; blocks this thread until it returns."""
        return self._view.run(self._queue.post(payload, properties, on_ack, guid=guid))

    def close(self, timeout: float = 30.0) -> None:
        """``await queue.close(timeout)`` on the loop."""
        self._view.run(self._queue.close(timeout))


class BlockingView:
    """The blocking surface ``Caller`` needs, over an asyncio ``Session``."""

    def __init__(self, session: Session, loop: asyncio.AbstractEventLoop) -> None:
        self._session = session
        self._loop = loop
        self._dispatcher = _LoopThread(loop)
        self._telemetry = session._telemetry

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the session's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def open_queue(self, uri: str, **how: Any) -> BlockingQueue:
        """``await session.open_queue(uri, **how)`` on the loop."""
        return BlockingQueue(self, self.run(self._session.open_queue(uri, **how)))


__all__ = ["BlockingQueue", "BlockingView"]

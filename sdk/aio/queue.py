"""``Queue`` of the asyncio API: post, iterate, configure, close."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from holdfast.sdk.engine import QueueRecord, QueueState
from holdfast.sdk.errors import QueueNotOpenError, QueueStateError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.aio.session import Session

_END: Any = object()
"""Put in a queue's inbox when no message can come any more (closed queue or session)."""


class Queue:
    """An open queue on an asyncio ``Session``. Use it from the session's event loop.

    ``async for message in queue`` yields the messages PUSHed to a queue opened with
    ``read=True`` (and no ``on_message``), within its ``QueueOptions`` flow limits;
    call ``message.confirm()`` once each is processed. The iteration ends when the
    queue or the session is closed.
    """

    def __init__(
        self, session: Session, record: QueueRecord, inbox: asyncio.Queue[Message] | None
    ) -> None:
        self._session = session
        self._record = record
        self._inbox = inbox

    @property
    def uri(self) -> str:
        """``hf://<domain>/<queue>``."""
        return self._record.uri

    @property
    def options(self) -> QueueOptions:
        """The latest options given at open or by ``configure``."""
        return self._record.options

    @property
    def is_open(self) -> bool:
        """False once the queue is closed (by ``close`` or by a failed reopen)."""
        return self._record.state not in (QueueState.CLOSED, QueueState.CLOSING)

    async def post(
        self,
        payload: bytes,
        properties: Mapping[str, str] | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
        *,
        guid: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Buffer a PUT and return its GUID once it is buffered (not once it is ACKed);
        ``on_ack`` is called exactly once, on the event loop.

        Never fails because the link is down. When the transport pushes back, awaits
        up to 5 s (the loop keeps running), then raises ``BandwidthLimitError``
        without taking the message. ``guid`` is for idempotent producers only.
        """
        self._check_open()
        return await self._session._post(self._record.queue_id, payload, properties, on_ack, guid)

    async def configure(self, options: QueueOptions, timeout: float = 30.0) -> None:
        """Change the consumer flow-control options; kept across reconnects."""
        self._check_open()
        await self._session._core.configure_queue(self._record.queue_id, options, timeout)

    async def close(self, timeout: float = 30.0) -> None:
        """Close the queue. While disconnected this is local: the queue is not reopened
        and its unacknowledged PUTs are reported ``UNKNOWN``. Ends any iteration."""
        self._check_open()
        try:
            await self._session._core.close_queue(self._record.queue_id, timeout)
        finally:
            self.end_iteration()

    def end_iteration(self) -> None:
        """Let ``async for`` over this queue finish (no further message can come)."""
        if self._inbox is not None:
            self._inbox.put_nowait(_END)

    def __aiter__(self) -> Queue:
        if self._inbox is None:
            raise QueueStateError(
                f"queue {self.uri} was not opened with read=True and without on_message, "
                "so it has no messages to iterate"
            )
        return self

    async def __anext__(self) -> Message:
        assert self._inbox is not None
        message = await self._inbox.get()
        if message is _END:
            self._inbox.put_nowait(_END)  # every later iteration ends too
            raise StopAsyncIteration
        return message

    def _check_open(self) -> None:
        """A closed handle says which queue it was (the engine has forgotten it)."""
        if self._record.state is QueueState.CLOSED:
            raise QueueNotOpenError(f"queue {self.uri} is closed")

    def __repr__(self) -> str:
        return f"Queue({self.uri!r}, state={self._record.state.value})"

"""``Queue`` of the asyncio API: post, iterate, configure, close."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from holdfast.sdk.engine import QueueRecord, QueueState
from holdfast.sdk.errors import QueueStateError
from holdfast.sdk.instrument import ItemSpans
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.producer import check_callback
from holdfast.sdk.queue import QueueHandle
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.aio.session import Session

_END: Any = object()
"""Put in a queue's inbox when no message can come any more (closed queue or session)."""


class Queue(QueueHandle):
    """An open queue on an asyncio ``Session``. Use it from the session's event loop.

    ``async for message in queue`` yields the messages PUSHed to a queue opened with
    ``read=True`` (and no ``on_message``), within its ``QueueOptions`` flow limits;
    call ``message.confirm()`` once each is processed. The iteration ends when the
    queue or the session is closed. Messages waiting when the connection drops are
    discarded (the broker redelivers them), so the inbox never holds more than one
    connection's flow limits. With OpenTelemetry each item has a ``process``
    span, ended when the next item is asked for or the queue or session is closed.
    """

    def __init__(
        self,
        session: Session,
        record: QueueRecord,
        inbox: asyncio.Queue[Message] | None,
        traced: bool = False,
    ) -> None:
        super().__init__(record)
        self._session = session
        self._inbox = inbox
        self._spans = ItemSpans() if traced else None

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
        without taking the message. Once a task has queued ``driver.aio.YIELD_EVERY``
        PUTs in a row that the writer has not taken, its next post first lets the
        loop run one turn, so that a loop of posts has them sent as it goes
        (cancelled there, it has taken nothing). ``guid`` is for idempotent
        producers only.
        """
        self._check_open()
        if on_ack is not None:
            check_callback("on_ack", on_ack)
        return await self._session._post(self._record.queue_id, payload, properties, on_ack, guid)

    async def post_many(
        self,
        payloads: Sequence[bytes],
        properties: Mapping[str, str] | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
    ) -> list[uuid.UUID]:
        """``post`` each of ``payloads`` in order, all or none (as the threaded
        ``Queue.post_many``); returns their GUIDs once they are buffered."""
        self._check_open()
        check_callback("on_ack", on_ack)
        return await self._session._post_many(self._record.queue_id, payloads, properties, on_ack)

    async def configure(self, options: QueueOptions, timeout: float = 30.0) -> None:
        """Change the consumer flow-control options; kept across reconnects."""
        self._check_open()
        await self._session._core.configure_queue(self._record.queue_id, options, timeout)

    async def close(self, timeout: float = 30.0) -> None:
        """Close the queue. While disconnected this is local: the queue is not reopened
        and its unacknowledged PUTs are reported ``UNKNOWN``. Ends any iteration. A
        queue closed already (by ``close``, a refused reopen or the end of the session)
        stays closed: nothing happens, as for a second ``Session.close()``."""
        if self._record.state is QueueState.CLOSED:
            return
        try:
            await self._session._core.close_queue(self._record.queue_id, timeout)
        finally:
            self.end_iteration()

    def discard_delivered(self) -> None:
        """Forget the messages waiting in the inbox (their connection was lost)."""
        if self._inbox is None:
            return
        ended = False
        while not self._inbox.empty():
            ended = self._inbox.get_nowait() is _END or ended
        if ended:
            self._inbox.put_nowait(_END)

    def delivered(self) -> list[Message]:
        """The messages delivered to this queue's iteration and not taken by it yet, in
        order (they stay there)."""
        if self._inbox is None:
            return []
        held = []
        while not self._inbox.empty():
            held.append(self._inbox.get_nowait())
        for item in held:
            self._inbox.put_nowait(item)
        return [item for item in held if item is not _END]

    def end_iteration(self) -> None:
        """Let ``async for`` over this queue finish (no further message can come)."""
        if self._spans is not None:
            self._spans.next(None)  # an iteration left by ``break``: its item is done
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
        if self._spans is not None:
            self._spans.next(None)  # the previous item is done
        message = await self._inbox.get()
        if message is _END:
            self._inbox.put_nowait(_END)  # every later iteration ends too
            raise StopAsyncIteration
        if self._spans is not None:
            self._spans.next(message)
        return message

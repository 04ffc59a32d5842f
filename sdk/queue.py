"""``Queue``: the handle ``Session.open_queue`` returns."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from holdfast.sdk.engine import QueueRecord, QueueState
from holdfast.sdk.errors import QueueNotOpenError, QueueStateError, SessionClosedError
from holdfast.sdk.inbox import Inbox, check_timeout, iterate
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.producer import check_callback
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.session import Session


class QueueHandle:
    """What every front-end's queue handle shows of its engine record (the synchronous
    ``Queue`` below and ``holdfast.sdk.aio.Queue``)."""

    def __init__(self, record: QueueRecord) -> None:
        self._record = record

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

    def _check_open(self) -> None:
        """A closed handle says which queue it was (the engine has forgotten it), or
        that the session ended: closed, or failed and why (``SessionClosedError``)."""
        record = self._record
        if record.state is QueueState.CLOSED:
            ended = record.session_end
            if ended is not None:
                raise SessionClosedError(str(ended)) from ended.__cause__
            raise QueueNotOpenError(f"queue {self.uri} is closed")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r}, state={self._record.state.value})"


class Queue(QueueHandle):
    """An open queue: post to it, read it, reconfigure it, close it. Thread-safe."""

    def __init__(self, session: Session, record: QueueRecord, inbox: Inbox | None = None) -> None:
        super().__init__(record)
        self._session = session
        self._inbox = inbox

    def messages(self, timeout: float | None = None) -> Iterator[Message]:
        """Iterate the messages PUSHed to this queue, in the caller's thread::

            queue = session.open_queue("hf://demo/orders", read=True)
            for message in queue.messages(timeout=5.0):
                handle(message.payload)
                message.confirm()

        ``timeout`` is how many seconds to wait for the *next* message before the
        iteration ends (None: wait for ever; 0: take only what has arrived). It also
        ends when the queue is closed (``close()``, or a reopen the broker refused) or
        the session is closed or fails. Settle each message as with ``on_message``
        (``confirm()`` or ``reject()``); an unsettled one counts against
        ``QueueOptions.max_unconfirmed_messages`` and ``_bytes``, so once the limit is
        reached no message comes until one is settled. Messages are held in memory
        only within those limits; the ones delivered on a connection that dropped are
        discarded (the broker redelivers them). Iterating again later goes on where
        this one stopped; several threads may iterate at once, each message going to
        one of them.

        Only for a queue opened with ``read=True`` and no ``on_message``:
        ``QueueStateError`` otherwise (the two would compete for the same messages).
        ``QueueNotOpenError`` once the queue is closed, ``SessionClosedError`` once the
        session is.
        """
        self._check_open()
        if self._inbox is None:
            how = "with on_message" if self._record.read else "without read=True"
            raise QueueStateError(
                f"queue {self.uri} was opened {how}: messages() needs a queue opened "
                "with read=True and no on_message"
            )
        return iterate(self._inbox, check_timeout(timeout))

    def post(
        self,
        payload: bytes,
        properties: Mapping[str, str] | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
        *,
        guid: uuid.UUID | None = None,
    ) -> uuid.UUID:
        """Buffer a PUT and return its GUID; ``on_ack`` is called exactly once.

        Never fails because the link is down: the PUT is kept until the broker
        ACKs it and retransmitted after a reconnect. When the transport pushes
        back, waits here up to 5 s, then raises ``BandwidthLimitError`` without
        taking the message.

        ``guid`` is for idempotent producers only (such as the Spark sink, whose
        retried tasks must post the same GUIDs again): by default the SDK assigns
        a fresh uuid7. A GUID still pending on this session is refused.
        """
        self._check_open()
        if on_ack is not None:
            check_callback("on_ack", on_ack)
        return self._session._post(self._record.queue_id, payload, properties, on_ack, guid)

    def post_many(
        self,
        payloads: Sequence[bytes],
        properties: Mapping[str, str] | None = None,
        on_ack: Callable[[Ack], Any] | None = None,
    ) -> list[uuid.UUID]:
        """``post`` each of ``payloads`` in order, with the same ``properties`` and
        ``on_ack`` (called once per message); returns their GUIDs, in order.

        All or none: a payload or the properties refused (``InvalidArgumentError``),
        a full disconnected buffer (``BufferFullError``) or the 5 s wait for the
        transport running out (``BandwidthLimitError``) raise without taking any of
        them. For producers with messages at hand: the checks, the session's lock
        and the wake-up of its writer are paid once for the batch, not per message.
        """
        self._check_open()
        check_callback("on_ack", on_ack)
        return self._session._post_many(self._record.queue_id, payloads, properties, on_ack)

    def configure(self, options: QueueOptions, timeout: float = 30.0) -> None:
        """Change the consumer flow-control options; kept across reconnects."""
        self._check_open()
        self._session._configure(self._record.queue_id, options, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Close the queue. While disconnected this is local: the queue is not
        reopened and its unacknowledged PUTs are reported ``UNKNOWN``. A queue closed
        already (by ``close``, a refused reopen or the end of the session) stays
        closed: nothing happens, as for a second ``Session.close()``."""
        if self._record.state is QueueState.CLOSED:
            return
        try:
            self._session._close_queue(self._record.queue_id, timeout)
        finally:
            if self._inbox is not None:
                self._inbox.end()

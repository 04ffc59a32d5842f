"""One active manager per pool: the manager holding the pool's token is the active one.

The token is one message on the pool's lock queue, under a GUID derived from the
pool (so however many managers post it, the broker's dedup keeps one while it
lives). Every manager consumes the lock queue with room for one message and never
confirms the token: the broker delivers it to one of them, which is active while it
holds it. When that manager's connection ends (it died, or its link dropped) the
broker redelivers the token to another; the manager that lost its link stops acting
at once (``ConnectionLost``), before the broker can hand the token on. Managers post
the token again now and then, so a broker that lost it (the memory store restarted)
gets it back. Acting twice for a moment is harmless anyway: every control step is
idempotent and forwards are deduplicated.
"""

from __future__ import annotations

import logging
import threading
import uuid

from holdfast.sdk import events as ev
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.poolnames import PoolNames
from holdfast.sdk.queue import Queue
from holdfast.sdk.session import Session
from holdfast.sdk.types import Message

log = logging.getLogger(__name__)

REPOST_INTERVAL = 5.0
"""Seconds between posts of the token (deduplicated while it lives)."""


def token_guid(names: PoolNames) -> uuid.UUID:
    """The token's GUID: the same for every manager of the pool."""
    return uuid.uuid5(uuid.NAMESPACE_URL, names.lock)


class Leadership:
    """Whether this manager holds its pool's token."""

    def __init__(self, names: PoolNames) -> None:
        self._names = names
        self._holding: Message | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: Queue | None = None
        self._stop = threading.Event()
        self._poster: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """True while this manager holds the token on a live connection."""
        with self._lock:
            return self._holding is not None

    def wait_active(self, timeout: float) -> bool:
        """Wait until this manager is the active one."""
        with self._changed:
            return self._changed.wait_for(lambda: self._holding is not None, timeout)

    def on_event(self, event: ev.SessionEvent) -> None:
        """Give the token up as soon as the link drops (the broker hands it on)."""
        if isinstance(event, ev.ConnectionLost | ev.SessionFailed | ev.SessionClosed):
            with self._changed:
                if self._holding is not None:
                    log.info("pool %s: no longer the active manager", self._names.uri)
                self._holding = None
                self._changed.notify_all()

    def start(self, session: Session) -> None:
        """Compete for the token on ``session``."""
        self._queue = session.open_queue(
            self._names.lock,
            read=True,
            write=True,
            on_message=self._on_token,
            options=QueueOptions(max_unconfirmed_messages=1),
        )
        self._poster = threading.Thread(
            target=self._post_token, name="holdfast-pool-token", daemon=True
        )
        self._poster.start()

    def stop(self) -> None:
        """Stop competing (closing the session gives the token back)."""
        self._stop.set()
        if self._poster is not None:
            self._poster.join(REPOST_INTERVAL + 1)

    def _on_token(self, message: Message) -> None:
        if message.guid != token_guid(self._names):
            message.confirm()  # not the token: nothing else belongs here
            return
        with self._changed:
            self._holding = message  # never confirmed: held while this manager lives
            self._changed.notify_all()
        log.info("pool %s: this manager is the active one", self._names.uri)

    def _post_token(self) -> None:
        guid = token_guid(self._names)
        while not self._stop.is_set():
            queue = self._queue
            if queue is not None:
                try:
                    queue.post(b"", {}, guid=guid)
                except HoldfastError as error:
                    log.debug("posting the pool token: %s", error)
            self._stop.wait(REPOST_INTERVAL)


__all__ = ["Leadership", "token_guid"]

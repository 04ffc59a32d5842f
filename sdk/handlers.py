"""What happens when an application's ``on_message`` raises.

A message whose handler raised is never left unconfirmed: it would sit with this
consumer until the session ends, and a consumer with a small
``max_unconfirmed_messages`` would stall for good. It is rejected with requeue
instead, after a back-off that doubles with each delivery
(``QueueOptions.retry_delay_for``), so a transient failure is retried and a poison
message loops slowly until the queue's delivery limit (``holdfast policy set URI
--max-deliveries N``) moves it to the dead-letter queue. A handler that settled the
message itself (``confirm()`` or ``reject()``) before raising is left alone. A
handler that returns an awaitable (a plain function handing back a coroutine, which
nobody awaits) has not handled its message: it is treated as one that raised.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.options import QueueOptions
from holdfast.sdk.types import Message

log = logging.getLogger(__name__)


def reject_on_failure(
    handler: Callable[[Message], Any], options: QueueOptions
) -> Callable[[Message], None]:
    """Wrap ``handler`` so that an exception rejects its message with requeue."""

    def handle(message: Message) -> None:
        try:
            result = handler(message)
            if result is not None and inspect.isawaitable(result):
                _discard(result)
                raise TypeError(
                    "on_message returned an awaitable, which is never awaited: "
                    "the message was not handled"
                )
        except Exception as error:
            if message.settled:
                log.exception("on_message raised after settling message %s", message.guid)
                return
            delay = options.retry_delay_for(message.delivery_count)
            log.warning(
                "on_message raised %s on message %s of %s (delivery %d); "
                "rejected with requeue, redelivered in %.2f s",
                type(error).__name__,
                message.guid,
                message.queue_uri,
                message.delivery_count,
                delay,
                exc_info=error,
            )
            try:
                message.reject(requeue=True, delay=delay)
            except HoldfastError as dropped:
                # The link is down or the delivery stale: the broker redelivers it anyway.
                log.info("the reject of %s did not leave: %s", message.guid, dropped)

    return handle


def _discard(awaitable: object) -> None:
    """Close a coroutine nobody will await (no "never awaited" warning, no leak)."""
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()


__all__ = ["reject_on_failure"]

"""Where the front-ends meet OpenTelemetry: the spans of a post, of processing a
message (an ``on_message`` handler or an iterator's item) and of settling it.

Used by the sync ``Session``, the asyncio one and their message iterators, only when
``holdfast.sdk.tracing.AVAILABLE`` and ``SessionOptions.telemetry`` (so the untraced
paths stay as they were). The engine knows nothing of this: a ``send`` span ends in
a wrapper of the PUT's ACK callback, when the dispatcher reports the outcome.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from holdfast.proto.limits import Limits
from holdfast.sdk import tracing
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from holdfast.sdk.queue_table import QueueRecord

Post = tuple[Any, "Mapping[str, str] | None", "Callable[[Ack], Any] | None"]
"""What ``prepare_post`` returns: the span (or None), the properties and ``on_ack`` to
post with."""


def prepare_post(
    record: QueueRecord | None,
    properties: Mapping[str, str] | None,
    on_ack: Callable[[Ack], Any] | None,
    explicit_guid: bool,
    limits: Limits,
) -> Post:
    """Start the ``send`` span of a post to ``record``'s queue: the properties carry its
    trace context (not for an explicit GUID: a replay must be byte-identical), and the
    ACK callback ends it with the outcome, then calls ``on_ack`` or the queue's."""
    if record is None:
        return None, properties, on_ack  # the post raises QueueNotOpenError itself
    span = tracing.start_send(record.uri, inject=not explicit_guid)
    if span is None:
        return None, properties, on_ack
    if not explicit_guid:
        properties = tracing.with_trace_context(span, properties, limits)

    def acked(ack: Ack) -> None:
        attrs = {
            "messaging.message.id": str(ack.guid),
            "messaging.holdfast.ack_status": ack.status.value,
        }
        tracing.end(span, None if ack.status.ok else ack.status.value, attrs)
        callback = on_ack if on_ack is not None else record.on_ack
        if callback is not None:
            callback(ack)

    return span, properties, acked


class Untraced:
    """An ``on_message`` handler of the SDK's own (request/reply's reply and control
    queues) whose messages get no ``process`` span: heartbeats and cancels are not the
    application's messages, and the ``call`` span covers the reply."""

    __slots__ = ("handler",)

    def __init__(self, handler: Callable[[Message], Any]) -> None:
        self.handler = handler

    def __call__(self, message: Message) -> Any:
        return self.handler(message)


def traced_handler(handler: Callable[[Message], Any]) -> Callable[[Message], Any]:
    """``handler`` run inside the message's ``process`` span (CONSUMER, the current span
    while it runs, under the trace the message carries); an ``Untraced`` one as it is."""
    if isinstance(handler, Untraced):
        return handler

    def process(message: Message) -> Any:
        if not tracing.configured():
            return handler(message)
        span = start_process(message)
        try:
            with tracing.current(span):
                result = handler(message)
        except BaseException as error:
            tracing.fail(span, error)
            raise
        tracing.end(span)
        return result

    return process


def start_process(message: Message) -> Span | None:
    """Start the ``process`` span of ``message`` (its settle spans are its children)."""
    span = tracing.message_span("process", tracing.PROCESS, "CONSUMER", message)
    if span is not None and span.is_recording():
        message._span = span
    return span


@contextlib.contextmanager
def settling(message: Message, reject: bool) -> Iterator[None]:
    """The ``settle`` span (CLIENT) of a CONFIRM or REJECT, under the message's process
    span, else the trace it carries (none if neither: a settle span alone would be a
    trace of its own); a dropped one ends in error."""
    if not tracing.configured():
        yield
        return
    parent = tracing.context_of(message._span) or tracing.extract(message.properties)
    if parent is None:
        yield
        return
    operation = "reject" if reject else "confirm"
    span = tracing.message_span(operation, tracing.SETTLE, "CLIENT", message, parent)
    try:
        yield
    except BaseException as error:
        tracing.fail(span, error)
        raise
    tracing.end(span)


class ItemSpans:
    """The ``process`` spans of an iterator's items: each runs from the moment its
    message is handed out until the next one is asked for (or the iteration ends)."""

    __slots__ = ("_span",)

    def __init__(self) -> None:
        self._span: Span | None = None

    def next(self, message: Message | None) -> None:
        """The previous item is done; ``message`` (None: the end) is handed out now."""
        tracing.end(self._span)
        self._span = None if message is None else start_process(message)


__all__ = [
    "ItemSpans",
    "Untraced",
    "prepare_post",
    "settling",
    "start_process",
    "traced_handler",
]

"""The OpenTelemetry spans of request/reply: ``call`` (the caller, CLIENT, from the
request to its reply or failure) and ``serve`` (the worker, SERVER, around the
handler), linked through the W3C trace context in the request's and the reply's
properties (``holdfast.sdk.tracing``). The request carries the call's context and the
reply the serve span's, both written once, when the message is built, so a request
or reply posted again under its GUID is the same bytes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from typing import TYPE_CHECKING, Any

from holdfast.sdk import tracing
from holdfast.sdk.types import Message

if TYPE_CHECKING:
    from opentelemetry.trace import Span


def _add_context(span: Span | None, properties: dict[str, str]) -> None:
    """Write ``span``'s trace context into ``properties`` unless they carry one."""
    if tracing.TRACEPARENT not in properties:
        properties.update(tracing.carrier(span))


def start_call(
    uri: str,
    guid: uuid.UUID,
    properties: dict[str, str],
    future: concurrent.futures.Future[Any] | asyncio.Future[Any],
) -> Span | None:
    """Start the ``call`` span of a request to ``uri``, ended with ``future``'s outcome;
    its request carries it."""
    if not tracing.configured():  # no provider: skip building the attributes too
        return None
    attrs = tracing.attributes(tracing.SEND, "call", uri, guid)
    attrs["rpc.system"] = tracing.SYSTEM
    span = tracing.start(f"call {uri}", "CLIENT", attrs)
    if span is not None:
        _add_context(span, properties)
        future.add_done_callback(lambda done: end_call(span, done))
    return span


def end_call(
    span: Span | None, future: concurrent.futures.Future[Any] | asyncio.Future[Any]
) -> None:
    """End a call's span with its outcome (a reply, an ``RpcError``, a cancel)."""
    if future.cancelled():
        tracing.end(span, "cancelled")
    elif (error := future.exception()) is not None:
        tracing.fail(span, error)
    else:
        tracing.end(span)


def start_serve(uri: str, message: Message) -> Span | None:
    """Start the ``serve`` span of a request a worker runs, under the caller's call."""
    if not tracing.configured():  # no provider: skip building the attributes too
        return None
    attrs = tracing.attributes(tracing.PROCESS, "serve", uri, message.guid)
    attrs["rpc.system"] = tracing.SYSTEM
    attrs["messaging.holdfast.delivery_count"] = message.delivery_count
    return tracing.start(f"serve {uri}", "SERVER", attrs, tracing.extract(message.properties))


def end_serve(
    span: Span | None, reply_properties: dict[str, str], error: BaseException | None = None
) -> None:
    """End a serve span; the reply (or error reply) carries it back to the caller."""
    if span is None:
        return
    _add_context(span, reply_properties)
    if error is not None:
        tracing.fail(span, error)
    else:
        tracing.end(span)


__all__ = ["end_call", "end_serve", "start_call", "start_serve"]

"""The servers' OpenTelemetry spans: the proxy's ``relay`` and the broker's ``accept``
and ``deliver``, for messages that carry a W3C trace context.

A server makes spans only for PUTs and messages whose properties carry a
``traceparent`` (written by the producer's SDK, ``holdfast.sdk.tracing``), as
children of it, so one trace links post → relay → accept → deliver → process; it
never starts traces of its own for untraced messages, and never rewrites the
properties (the broker's dedup compares them). Nothing happens unless the ``[otel]``
extra is installed and the process configured a tracer provider (``active``), so a
busy server pays one check per frame.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from holdfast.proto import pb, status_name
from holdfast.proto.columns import PutColumns
from holdfast.sdk import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

_OK = pb.STATUS_OK


def active() -> bool:
    """True when spans would go somewhere: OpenTelemetry installed and a tracer
    provider configured by the process."""
    return tracing.AVAILABLE and tracing.configured()


def _traced(puts: PutColumns) -> Iterable[tuple[int, int, bytes, Mapping[str, str]]]:
    """(index, queue_id, guid, properties) of the traced PUTs of a batch: only PUTs with
    properties can be traced, and the batch lists those apart."""
    for index, properties in puts.properties.items():
        if tracing.TRACEPARENT in properties:
            yield index, puts.queue_ids[index], puts.guids[index], properties


def _start(
    operation: str,
    operation_type: str,
    kind: str,
    uri: str,
    guid: bytes,
    properties: Mapping[str, str],
    start_time: int | None = None,
) -> Span | None:
    attrs = tracing.attributes(operation_type, operation, uri, _guid_text(guid))
    parent = tracing.extract(properties)
    return tracing.start(f"{operation} {uri}", kind, attrs, parent, start_time)


def _end(span: Span | None, status: int) -> None:
    name = status_name(status)
    tracing.end(span, None if status == _OK else name, {"messaging.holdfast.ack_status": name})


def _guid_text(guid: bytes) -> str:
    """The GUID as ``post()`` returned it (a malformed one, refused anyway, in hex)."""
    return str(uuid.UUID(bytes=guid)) if len(guid) == 16 else guid.hex()


class RelaySpans:
    """The proxy's ``relay`` spans of one client's PUTs (PRODUCER, ``send``): from the
    PUT's arrival to the ACK the proxy gives the client, by GUID."""

    __slots__ = ("_spans",)

    def __init__(self) -> None:
        self._spans: dict[bytes, list[Span]] = {}

    def __bool__(self) -> bool:
        return bool(self._spans)

    def arrived(self, puts: PutColumns, handles: Mapping[int, Any]) -> None:
        """A PutBatch arrived: start a span for each traced PUT."""
        for _, queue_id, guid, properties in _traced(puts):
            handle = handles.get(queue_id)
            uri = handle.uri if handle is not None else ""
            span = _start("relay", tracing.SEND, "PRODUCER", uri, guid, properties)
            if span is not None:
                self._spans.setdefault(guid, []).append(span)

    def acked(self, guid: bytes, status: int) -> None:
        """The client is ACKed for ``guid``: the oldest span of that GUID ends."""
        spans = self._spans.get(guid)
        if spans:
            _end(spans.pop(0), status)
            if not spans:
                del self._spans[guid]


class AcceptSpans:
    """The broker's ``accept`` spans of one PutBatch (CONSUMER, ``receive``): from the
    frame's arrival to the final ACK of each traced PUT, by its place in the frame."""

    __slots__ = ("_spans",)

    def __init__(self, puts: PutColumns, handles: Mapping[int, Any]) -> None:
        self._spans: dict[int, Span] = {}
        for index, queue_id, guid, properties in _traced(puts):
            handle = handles.get(queue_id)
            uri = handle.queue.uri if handle is not None else ""
            span = _start("accept", tracing.RECEIVE, "CONSUMER", uri, guid, properties)
            if span is not None:
                self._spans[index] = span

    def __bool__(self) -> bool:
        return bool(self._spans)

    def finished(self, acks: Sequence[tuple[int, bytes, int]]) -> None:
        """The frame's ACKs are final (in PUT order): end each span with its status."""
        for index, span in self._spans.items():
            _end(span, acks[index][2])
        self._spans = {}


def accept_spans(puts: PutColumns, handles: Mapping[int, Any]) -> AcceptSpans | None:
    """The accept spans of a PutBatch, or None when there is none to make."""
    if not active():
        return None
    spans = AcceptSpans(puts, handles)
    return spans if spans else None


def delivered(messages: Iterable[tuple[Any, int]], since: int | None) -> None:
    """The broker PUSHed these ``(StoredMessage, delivery_count)``: a ``deliver`` span
    (PRODUCER, ``send``) for each traced one, from the moment its delivery was decided
    (``since``, ns; the store made its count durable meanwhile) to now."""
    now = time.time_ns()
    for message, count in messages:
        properties = message.properties
        if properties and tracing.TRACEPARENT in properties:
            span = _start(
                "deliver",
                tracing.SEND,
                "PRODUCER",
                message.queue_uri,
                message.guid,
                properties,
                since or now,
            )
            tracing.end(span, None, {"messaging.holdfast.delivery_count": count})


__all__ = ["AcceptSpans", "RelaySpans", "accept_spans", "active", "delivered"]

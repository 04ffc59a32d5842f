"""OpenTelemetry spans and W3C trace context for Holdfast (the ``[otel]`` extra).

The only module that imports ``opentelemetry``: without the extra installed every
function here does nothing (and costs one flag test), so the SDK, the proxy and the
broker work unchanged. With it, Holdfast uses the *global* tracer and meter
providers (``opentelemetry.trace.set_tracer_provider``): configure them in your
application as usual; until you do, the API's no-op providers make this cheap.

Trace context travels in message properties, as W3C ``traceparent`` and
``tracestate`` (``TRACEPARENT``, ``TRACESTATE``). ``post()`` writes them once, when
the PUT is buffered, so every retransmit carries the same bytes and the broker's
dedup (which compares properties) still recognises a replay. For the same reason a
PUT posted with an explicit ``guid=`` (an idempotent producer that may post the same
message again from another process) gets no trace context written for it; nor is
one written when the application set ``traceparent`` itself or when it would not
fit the broker's property limits. No hop rewrites them: the proxy and the broker
read them to parent their own spans.

Spans follow the OpenTelemetry messaging semantic conventions: ``messaging.system``
is ``holdfast``, ``messaging.destination.name`` the queue URI,
``messaging.message.id`` the message GUID, ``messaging.operation.type`` one of
``send``, ``receive``, ``process``, ``settle`` (``send`` is what the conventions
call the operation once named ``publish``), ``messaging.operation.name`` the
Holdfast step. Spans by hop are listed in ``docs/observability.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from holdfast.proto.limits import Limits
from holdfast.proto.validate import properties_size

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
except ImportError:  # the [otel] extra is not installed: every hook does nothing
    AVAILABLE = False

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

__all__ = [
    "AVAILABLE",
    "SYSTEM",
    "TRACEPARENT",
    "TRACESTATE",
    "carrier",
    "configured",
    "context_of",
    "current",
    "end",
    "extract",
    "fail",
    "otel_metrics",
    "recheck",
    "start",
    "start_send",
    "suppressed",
    "suppressed_call",
    "with_trace_context",
]

SYSTEM = "holdfast"
"""``messaging.system`` of every Holdfast span."""
TRACEPARENT = "traceparent"
"""The message property that carries the W3C trace context."""
TRACESTATE = "tracestate"
"""The message property that carries vendor trace state, when there is some."""
SCOPE = "holdfast"
"""The instrumentation scope of Holdfast's tracer and meter."""

# Operation types of the messaging semantic conventions.
SEND = "send"
RECEIVE = "receive"
PROCESS = "process"
SETTLE = "settle"

_tracer: Any = None
_propagator: Any = None
if AVAILABLE:
    # A proxy tracer: it follows the global provider even if it is set later.
    _tracer = otel_trace.get_tracer(SCOPE)
    _propagator = TraceContextTextMapPropagator()


RECHECK = 1.0
"""Seconds between looks for a tracer provider while none is set."""

_configured = False
_next_check = 0.0


def configured() -> bool:
    """True once the process has set a tracer provider. Until then the API's default is
    a proxy with nothing behind it, every span would be a no-op, and the hooks skip the
    work (a provider set later is noticed within ``RECHECK`` seconds; it can be set
    only once, so a yes is final). Called once per message: a flag and, at most every
    ``RECHECK`` seconds, a look at the global provider."""
    global _configured, _next_check
    if _configured or not AVAILABLE:
        return _configured
    now = time.monotonic()
    if now < _next_check:
        return False
    _next_check = now + RECHECK
    provider = otel_trace.get_tracer_provider()
    unset = otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider
    _configured = not isinstance(provider, unset)
    return _configured


_suppressed = contextvars.ContextVar("holdfast_tracing_suppressed", default=False)


@contextlib.contextmanager
def suppressed() -> Iterator[None]:
    """No ``send`` span and no trace context for posts made in this block (the SDK's
    own control messages: request/reply heartbeats and cancels)."""
    token = _suppressed.set(True)
    try:
        yield
    finally:
        _suppressed.reset(token)


def recheck() -> None:
    """Look for a tracer provider at the next message, not up to ``RECHECK`` seconds
    later (after ``set_tracer_provider``, when the very next messages must be traced)."""
    global _next_check
    _next_check = 0.0


def suppressed_call(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a ``suppressed()`` block (for an executor to run)."""
    with suppressed():
        return function(*args)


def _kind(name: str) -> Any:
    return getattr(SpanKind, name)


def attributes(
    operation_type: str, operation: str, uri: str, guid: object = None
) -> dict[str, str | int]:
    """The messaging attributes of a span about queue ``uri`` (and message ``guid``)."""
    values: dict[str, str | int] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation_type,
        "messaging.operation.name": operation,
        "messaging.destination.name": uri,
    }
    if guid is not None:
        values["messaging.message.id"] = str(guid)
    return values


def extract(properties: Mapping[str, str] | None) -> Context | None:
    """The trace context a message carries (None: none, or no OpenTelemetry)."""
    if not AVAILABLE or not properties or TRACEPARENT not in properties:
        return None
    carried = {TRACEPARENT: properties[TRACEPARENT]}
    if TRACESTATE in properties:
        carried[TRACESTATE] = properties[TRACESTATE]
    context: Context = _propagator.extract(carried)
    return context


def carrier(span: Span | None) -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) naming ``span``; empty without a valid span."""
    if span is None:
        return {}
    context = span.get_span_context()
    if not context.is_valid:
        return {}
    # What TraceContextTextMapPropagator.inject writes (version 00), without the
    # context API's detours: this runs once per post.
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    carried = {TRACEPARENT: traceparent}
    if context.trace_state:
        carried[TRACESTATE] = context.trace_state.to_header()
    return carried


def start(
    name: str,
    kind: str,
    attrs: Mapping[str, str | int],
    parent: Context | None = None,
    start_time: int | None = None,
) -> Span | None:
    """Start a span (``kind``: a ``SpanKind`` name) under ``parent``, or the current
    context when None. None without OpenTelemetry."""
    if not configured():
        return None
    span: Span = _tracer.start_span(
        name, context=parent, kind=_kind(kind), attributes=attrs, start_time=start_time
    )
    return span


def end(
    span: Span | None, error: str | None = None, attrs: Mapping[str, str | int] | None = None
) -> None:
    """End ``span`` (None: nothing) with ``attrs`` added, and an error status if
    ``error`` is given."""
    if span is None:
        return
    if attrs:
        span.set_attributes(attrs)
    if error is not None:
        span.set_status(StatusCode.ERROR, error)
    span.end()


def fail(span: Span | None, error: BaseException) -> None:
    """End ``span`` with ``error`` recorded on it. An error whose ``__str__`` raises is
    recorded by its type alone: the exception escaped from here and cost a served
    request its error reply (the call timed out)."""
    if span is None:
        return
    try:
        text = str(error)
    except Exception as failure:
        text = f"<str() raised {type(failure).__name__}>"
    else:
        span.record_exception(error)  # it formats the message with str() too
    end(span, f"{type(error).__name__}: {text}")


def context_of(span: Span | None) -> Context | None:
    """A context whose current span is ``span`` (a parent for other spans)."""
    if span is None:
        return None
    context: Context = otel_trace.set_span_in_context(span)
    return context


_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
"""``current(None)``: one shared do-nothing block, not a generator made for each call
(request/reply enters ``current`` per call and per served request, mostly untraced)."""


def current(span: Span | None) -> contextlib.AbstractContextManager[None]:
    """Make ``span`` the current span in this block (nothing for None); it is not ended."""
    return _NO_SPAN if span is None else _attached(span)


@contextlib.contextmanager
def _attached(span: Span) -> Iterator[None]:
    token = otel_context.attach(otel_trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


def start_send(uri: str, inject: bool) -> Span | None:
    """The ``send`` span of a post (PRODUCER, from ``post()`` to its ACK), or None
    when nothing would record or carry it (no OpenTelemetry, no provider configured,
    or a span neither recorded nor part of a trace). ``inject``: its context may be
    written into the properties."""
    if not configured() or _suppressed.get():
        return None
    span: Span = _tracer.start_span(
        f"send {uri}", kind=SpanKind.PRODUCER, attributes=attributes(SEND, SEND, uri)
    )
    if not span.is_recording() and not (inject and span.get_span_context().is_valid):
        return None
    return span


def with_trace_context(
    span: Span | None, properties: Mapping[str, str] | None, limits: Limits
) -> Mapping[str, str] | None:
    """``properties`` with ``span``'s ``traceparent``/``tracestate`` added, if they have
    none yet and the result stays within ``limits``; else ``properties`` unchanged
    (also when they are malformed: the post then refuses them with its usual error)."""
    carried = carrier(span)
    if not carried:
        return properties
    if not properties:
        merged: dict[str, str] = {}
    elif not isinstance(properties, Mapping) or TRACEPARENT in properties:
        return properties
    else:
        merged = dict(properties)
    try:
        before = properties_size(merged)
    except (AttributeError, TypeError, UnicodeEncodeError):
        return properties
    if (
        len(merged) + len(carried) > limits.max_properties
        or before + properties_size(carried) > limits.max_properties_bytes
    ):
        return properties  # the application's properties come first
    merged.update(carried)
    return merged


def message_span(
    operation: str, operation_type: str, kind: str, message: Any, parent: Context | None = None
) -> Span | None:
    """A span about one delivered ``Message`` (process or settle), under ``parent`` or
    else the trace the message carries."""
    if not configured():
        return None
    attrs = attributes(operation_type, operation, message.queue_uri, message.guid)
    attrs["messaging.holdfast.delivery_count"] = message.delivery_count
    if parent is None:
        parent = extract(message.properties)
    return start(f"{operation} {message.queue_uri}", kind, attrs, parent)

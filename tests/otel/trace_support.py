"""Reading finished spans: parents, trace ids, attributes."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import format_span_id, format_trace_id


def names(traceparent: str, span: ReadableSpan) -> bool:
    """True if the W3C ``traceparent`` names ``span`` (its trace and span ids; the
    flags vary: sampled, and random trace ids with newer SDKs)."""
    context = span.get_span_context()
    assert context is not None
    ids = f"00-{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}-"
    return traceparent.startswith(ids) and len(traceparent) == len(ids) + 2


def is_child(child: ReadableSpan, parent: ReadableSpan) -> bool:
    """True if ``child``'s parent is ``parent`` (same trace, its span id)."""
    context = parent.get_span_context()
    assert context is not None
    return (
        child.parent is not None
        and child.parent.span_id == context.span_id
        and child.parent.trace_id == context.trace_id
    )


def attribute(span: ReadableSpan, name: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(name)


def trace_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id

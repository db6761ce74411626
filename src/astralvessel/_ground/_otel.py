"""OpenTelemetry spans, when the ``otel`` extra (opentelemetry-api) is installed.

Without it every function here returns at once and nothing is imported. With
it, spans go to whatever tracer provider the host set up (none: the API's
no-op one). A turn's span is a child of the caller's current span; its calls,
execs, file operations and sandbox start are children of the turn's. Spans are
started without becoming current, so concurrent calls of one turn never
parent each other.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

_trace: Any
try:
    from opentelemetry import trace as _trace
except ImportError:  # the extra is not installed: no spans, no cost
    _trace = None

__all__ = ["end", "record", "start"]

_SCOPE = "astralvessel"

#: Attribute values OpenTelemetry takes; anything else is sent as its text.
_PLAIN = (str, bool, int, float)


@functools.cache
def _tracer() -> Any:
    # Once per process: a tracer taken before the host sets its provider is a proxy that
    # follows the provider set later, as OpenTelemetry's API promises.
    return _trace.get_tracer(_SCOPE)


def _attributes(values: Mapping[str, object]) -> dict[str, Any]:
    return {k: v if isinstance(v, _PLAIN) else str(v) for k, v in values.items() if v is not None}


def start(name: str, attributes: Mapping[str, object], parent: Any = None) -> Any:
    """A started span (a child of ``parent``, else of the current span), or None."""
    if _trace is None:
        return None
    context = None if parent is None else _trace.set_span_in_context(parent)
    tracer = _tracer()
    return tracer.start_span(name, context=context, attributes=_attributes(attributes))


def end(span: Any, attributes: Mapping[str, object]) -> None:
    """Set ``attributes`` on ``span`` and end it (nothing for None)."""
    if span is None:
        return
    span.set_attributes(_attributes(attributes))
    span.end()


def record(name: str, attributes: Mapping[str, object], parent: Any, duration: float) -> None:
    """A span for something that ended just now and took ``duration`` seconds."""
    if _trace is None:
        return
    now = time.time_ns()
    context = None if parent is None else _trace.set_span_in_context(parent)
    tracer = _tracer()
    span = tracer.start_span(
        name,
        context=context,
        attributes=_attributes(attributes),
        start_time=now - int(duration * 1e9),
    )
    span.end(end_time=now)

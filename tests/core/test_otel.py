"""OpenTelemetry spans: a turn's, its calls', execs', file operations', sandbox start's and
proxy connections', each with its attributes, under the caller's current span."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from astralvessel import Executor, Registry

SRC = Path(__file__).parents[2] / "src"


class _Gate(SimpleSpanProcessor):
    """Exports only while a test of this module runs: the provider outlives it (OpenTelemetry
    sets one per process), and later tests' spans must not pile up in memory."""

    open = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.open:
            super().on_end(span)


_EXPORTER = InMemorySpanExporter()
_GATE = _Gate(_EXPORTER)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once) exporting to memory for this test only."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_GATE)
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _GATE.open = True
    try:
        yield _EXPORTER
    finally:
        _GATE.open = False
        _EXPORTER.clear()


def _bash() -> Registry:
    registry = Registry()
    registry.add_builtin("bash")
    return registry


def _by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        named.setdefault(span.name, []).append(span)
    return named


def test_a_turn_is_a_tree_of_spans_under_the_callers(spans: InMemorySpanExporter) -> None:
    """The turn's span is the caller's child; its sandbox start, call, exec and file operation
    are the turn's children, with backend, tool, outcome and sizes."""
    tracer = trace.get_tracer("host")
    executor = Executor(_bash(), sandbox="bubblewrap")
    with tracer.start_as_current_span("episode") as episode, executor.turn() as turn:
        turn.call("bash", {"command": "echo hi; exit 3"})
        turn.exec(["/bin/echo", "out"])
        turn.write_file("n.txt", "abc")
    named = _by_name(spans.get_finished_spans())
    (turn_span,) = named["astralvessel.turn"]
    assert turn_span.parent is not None
    assert turn_span.parent.span_id == episode.get_span_context().span_id
    assert turn_span.attributes is not None
    assert turn_span.attributes["astralvessel.backend"] == "bubblewrap"
    assert turn_span.attributes["astralvessel.calls"] == 1
    children = ["astralvessel.sandbox.start", "astralvessel.call", "astralvessel.exec"]
    for name in [*children, "astralvessel.file"]:
        (span,) = named[name]
        assert span.parent is not None
        assert span.parent.span_id == turn_span.context.span_id, name
    (call,) = named["astralvessel.call"]
    assert dict(call.attributes or {}) == {
        "astralvessel.tool": "bash",
        "astralvessel.outcome": "failed",
        "astralvessel.backend": "bubblewrap",
        "astralvessel.text_chars": len("hi\n[exit code 3]"),
        "astralvessel.dropped_chars": 0,
    }
    (exec_span,) = named["astralvessel.exec"]
    assert exec_span.attributes is not None
    assert exec_span.attributes["astralvessel.outcome"] == "ok"
    assert exec_span.attributes["astralvessel.stdout_bytes"] == 4
    (file_span,) = named["astralvessel.file"]
    assert file_span.attributes is not None
    assert (file_span.attributes["astralvessel.op"], file_span.attributes["astralvessel.size"]) == (
        "write",
        3,
    )


def test_proxy_connections_are_spans_of_the_turn(spans: InMemorySpanExporter) -> None:
    """A connection the egress proxy refused is a span under the turn's, saying why."""
    fetch = (
        'python3 -c "import urllib.request as u\n'
        "try: u.urlopen('http://not-listed.test/', timeout=20)\n"
        'except Exception as e: print(e)"'
    )
    executor = Executor(_bash(), sandbox="bubblewrap", network_allow=["pypi.org"])
    with executor.turn() as turn:
        turn.call("bash", {"command": fetch})
    named = _by_name(spans.get_finished_spans())
    (turn_span,) = named["astralvessel.turn"]
    (connection,) = named["astralvessel.proxy.connection"]
    assert connection.parent is not None
    assert connection.parent.span_id == turn_span.context.span_id
    assert connection.attributes is not None
    assert connection.attributes["astralvessel.refused"] is True
    assert "not-listed.test" in str(connection.attributes["astralvessel.reason"])


def test_without_opentelemetry_nothing_is_traced() -> None:
    """Without the otel extra a turn runs as before, and no span function imports anything."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from astralvessel import Executor, Registry; from astralvessel._ground import _otel\n"
        "assert _otel._trace is None\n"
        "r = Registry(); r.add_builtin('bash')\n"
        "with Executor(r, sandbox='bubblewrap').turn() as t:\n"
        "    print(t.call('bash', {'command': 'echo fine'}).text)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "fine\n[exit code 0]\n", "")

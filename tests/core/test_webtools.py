"""webfetch and websearch through the executor: the host-side glue and the output cap."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel import Executor, Registry
from astralvessel._webtools import cap_fenced
from astralvessel.web import AllowRule, EgressPolicy, Fetcher, LocalIndexProvider

SAMPLE = Path(__file__).parents[2] / "examples" / "sample-data"


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = (
            b"<html><body><h1>Otters</h1><p>They eat fish.</p><script>evil()</script></body></html>"
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    """A real HTTP server on the loopback interface."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/otters"
    httpd.shutdown()
    httpd.server_close()


def web_executor(**kw: object) -> Executor:
    registry = Registry()
    registry.add_builtin("webfetch")
    registry.add_builtin("websearch")
    return Executor(registry, sandbox="unconfined", **kw)  # type: ignore[arg-type]


def test_webfetch_reaches_an_allowed_server_and_fences_the_page(server: str) -> None:
    """With an operator allow rule, webfetch returns the page as fenced, readable text."""
    fetcher = Fetcher(EgressPolicy(allow=(AllowRule.parse("127.0.0.1/32"),)))
    with web_executor(fetcher=fetcher).turn() as turn:
        result = turn.call("webfetch", {"url": server})
    assert not result.is_error, result.text
    assert result.text.startswith(f'<web_content source="{server}">\n[Untrusted text from the web')
    assert "Otters" in result.text
    assert "They eat fish." in result.text
    assert "evil()" not in result.text
    assert result.text.endswith("</web_content>")


def test_webfetch_refuses_loopback_by_default(server: str) -> None:
    """Without an allow rule, the default policy refuses the loopback server."""
    with web_executor().turn() as turn:
        result = turn.call("webfetch", {"url": server})
    assert result.is_error
    assert result.text.startswith("refused: ")
    assert "webfetch reaches only public addresses" in result.text


def test_websearch_with_a_local_index() -> None:
    """A deployment's search provider answers websearch, fenced like webfetch."""
    with (
        LocalIndexProvider(SAMPLE / "species") as provider,
        web_executor(searcher=provider).turn() as turn,
    ):
        result = turn.call("websearch", {"query": "spraints", "max_results": 3})
    assert not result.is_error, result.text
    assert "otter" in result.text.lower()
    assert result.text.endswith("</web_content>")


def test_websearch_unconfigured_is_an_error_not_an_empty_result() -> None:
    """Without a provider, websearch is an error that says it does not mean nothing exists."""
    with web_executor().turn() as turn:
        result = turn.call("websearch", {"query": "otters"})
    assert result.is_error
    assert "does not mean nothing exists" in result.text


def test_cap_keeps_the_closing_fence() -> None:
    """Cutting a long fenced page keeps the wrapper closed and counts what was dropped."""
    page = '<web_content source="x">\n' + "a" * 1000 + "\n</web_content>"
    text, dropped = cap_fenced(page, 100)
    assert text.endswith("\n</web_content>")
    assert dropped == len(page) - len("\n</web_content>") - (100 - len("\n</web_content>"))
    assert f"[output truncated: {dropped} more characters were dropped]" in text

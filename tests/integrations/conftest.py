"""Fixtures for the integration tests: real agent folders, a real sandbox, a real HTTP service."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import pytest

from astralvessel.sandbox._base import Sandbox
from astralvessel.sandbox._discovery import get_backend

#: Deep Agents needs Python 3.11; its modules are not collected on 3.10 (as tests/inspect's).
collect_ignore_glob = ["test_deepagents*.py"] if sys.version_info < (3, 11) else []

#: The backend the integration tests confine declared tools with; CI must have it.
BACKEND = "bubblewrap"


@pytest.fixture(scope="session")
def backend() -> Sandbox:
    """The real sandbox backend the tests run declared tools in."""
    return get_backend(BACKEND)


@attrs.define
class Reply:
    """What the fake service answers to one request."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = attrs.Factory(dict)
    delay: float = 0.0


@attrs.define
class Service:
    """A real HTTP service on loopback: records every POST and answers from ``reply``."""

    url: str
    requests: list[dict[str, Any]] = attrs.Factory(list)
    paths: list[str] = attrs.Factory(list)
    reply: Callable[[dict[str, Any]], Reply] = lambda _: Reply(body=b"ok")


@pytest.fixture
def service() -> Iterator[Service]:
    """A loopback HTTP server standing in for an operator's tool service."""
    state = Service(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"null")
            state.paths.append(self.path)
            state.requests.append(
                {"body": request, "content_type": self.headers.get("Content-Type")}
            )
            reply = state.reply(request)
            if reply.delay:
                time.sleep(reply.delay)  # the server side of a slow service, not a test timing
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            # The client may stop reading past its limits; that is not the server's failure.
            with contextlib.suppress(OSError):
                self.wfile.write(reply.body)

        def do_GET(self) -> None:
            state.paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False  # a handler still sleeping must not hold up teardown
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}/tools"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()

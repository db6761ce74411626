"""A service on the host, reached by name: ``Executor(network_allow=..., network_hosts=...)``.

The operator pins ``svc.test`` to the host's loopback, where a real HTTP server
listens, and lists ``svc.test:PORT``; a call reaches it by that name through the
turn's egress proxy, and the pinned address is admitted on that port alone.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from astralvessel import Executor, Registry, Turn
from astralvessel.sandbox import Sandbox
from astralvessel.web import Fetcher

NAME = "svc.test"
GREETING = "hello from the host's service\n"

FETCH = """
import json, sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=20) as reply:
        print(json.dumps({"status": reply.status, "body": reply.read().decode()}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": error.read().decode()}))
except OSError as error:
    print(json.dumps({"status": None, "body": str(error)}))
"""


class _Service(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = GREETING.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Keep test output quiet."""


def _serve() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def services() -> Iterator[tuple[int, int]]:
    """Two services on the host's loopback: their ports."""
    first, second = _serve(), _serve()
    try:
        yield first.server_address[1], second.server_address[1]
    finally:
        for server in (first, second):
            server.shutdown()
            server.server_close()


def _fetch(turn: Turn, url: str) -> dict[str, object]:
    # NO_PROXY is emptied so that even a name like localhost goes through the proxy's rules.
    done = turn.exec(["python3", "-c", FETCH, url], env={"NO_PROXY": "", "no_proxy": ""})
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_pinned_host_service_is_reached_by_name(
    backend: Sandbox, services: tuple[int, int]
) -> None:
    """A listed name the operator pins to the host's loopback serves the call's request."""
    port, _ = services
    executor = Executor(
        Registry(),
        sandbox=backend,
        network_allow=[f"{NAME}:{port}"],
        network_hosts={NAME: "127.0.0.1"},
    )
    with executor, executor.turn() as turn:
        assert _fetch(turn, f"http://{NAME}:{port}/") == {"status": 200, "body": GREETING}


class _Dns:
    """A DNS server's stand-in: ``dns.test`` answers the host's loopback, as a hostile or a
    careless record could."""

    def resolve(self, host: str, port: int) -> list[str]:
        if host == "dns.test":
            return ["127.0.0.1"]
        raise OSError(f"{host}: no such name")


def test_the_pinned_address_is_admitted_on_the_names_ports_only(
    backend: Sandbox, services: tuple[int, int]
) -> None:
    """Another listed name whose DNS answer is the pinned address stays refused on its own
    port (the pin admits the address on the pinned name's ports alone), and without the pin
    the name reaches nothing."""
    port, other = services
    pinned = Executor(
        Registry(),
        sandbox=backend,
        fetcher=Fetcher(resolver=_Dns()),
        network_allow=[f"{NAME}:{port}", f"dns.test:{other}"],
        network_hosts={NAME: "127.0.0.1"},
    )
    with pinned, pinned.turn() as turn:
        assert _fetch(turn, f"http://{NAME}:{port}/") == {"status": 200, "body": GREETING}
        refused = _fetch(turn, f"http://dns.test:{other}/")
    assert refused["status"] == 403, refused
    unpinned = Executor(
        Registry(),
        sandbox=backend,
        fetcher=Fetcher(resolver=_Dns()),
        network_allow=[f"{NAME}:{port}"],
    )
    with unpinned, unpinned.turn() as turn:
        unknown = _fetch(turn, f"http://{NAME}:{port}/")
    assert unknown["status"] != 200, unknown
    assert GREETING not in str(unknown["body"])

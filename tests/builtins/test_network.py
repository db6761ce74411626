"""The allow-listed network through the executor: a turn starts its proxy and ends it.

The conformance suite drives the proxy and the relay on every backend at the
sandbox's level; here the host's own path is checked on bubblewrap: the
executor's list, webfetch's ``Fetcher`` as the egress policy, the model's
``bash`` call, and the turn's end.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from astralvessel import Executor, Registry
from astralvessel.web import AllowRule, EgressPolicy, Fetcher


class _Hello(BaseHTTPRequestHandler):
    """Answers every GET with the Host header it saw."""

    def do_GET(self) -> None:
        """Reply with one line naming the Host."""
        body = f"hello, {self.headers['Host']}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Keep test output quiet."""


@pytest.fixture(scope="module")
def origin_port() -> Iterator[int]:
    """A plain HTTP origin on the host's loopback."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


class _Names:
    """pkgs.test is the origin; nothing else resolves."""

    def resolve(self, host: str, port: int) -> Sequence[str]:
        """Answer pkgs.test, refuse the rest as an unknown name."""
        if host != "pkgs.test":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return ["127.0.0.1"]


def _executor(port: int, allow: list[str] | None, *, warm: int = 0) -> Executor:
    registry = Registry()
    registry.add_builtin("bash")
    fetcher = Fetcher(
        EgressPolicy(allow=[AllowRule(network="127.0.0.1/32", ports=[port])]), resolver=_Names()
    )
    return Executor(registry, sandbox="bubblewrap", fetcher=fetcher, network_allow=allow, warm=warm)


def test_bash_reaches_the_listed_host(origin_port):
    """A model's bash call fetches from the host the executor lists, through the turn's proxy."""
    executor = _executor(origin_port, [f"pkgs.test:{origin_port}"])
    with executor.turn() as turn:
        result = turn.call("bash", {"command": f"curl -sS http://pkgs.test:{origin_port}/"})
    assert result.text == f"hello, pkgs.test:{origin_port}\n[exit code 0]"


def test_bash_sees_the_refusal_of_an_unlisted_port(origin_port):
    """A listed name on a port the list does not give is refused with the proxy's reason."""
    executor = _executor(origin_port, ["pkgs.test"])
    with executor.turn() as turn:
        result = turn.call("bash", {"command": f"curl -sS http://pkgs.test:{origin_port}/"})
    assert "is not on this turn's network allow-list (pkgs.test)" in result.text


def test_turn_end_takes_the_proxy_with_it(origin_port):
    """Closing the turn ends its proxy: the socket folder is gone and its thread has stopped."""
    executor = _executor(origin_port, [f"pkgs.test:{origin_port}"])
    turn = executor.turn()
    turn.call("bash", {"command": "true"})
    proxy = turn._proxy
    assert proxy is not None
    assert proxy.socket_path.exists()
    turn.close()
    assert not proxy.folder.exists()
    assert not [t for t in threading.enumerate() if t.name == "astralvessel-egress"]


def test_no_list_means_no_proxy(origin_port):
    """Without a list the turn starts no proxy and calls have no proxy variables."""
    executor = _executor(origin_port, None)
    with executor.turn() as turn:
        result = turn.call("bash", {"command": "env | grep -ci proxy || true"})
        assert turn._proxy is None
    assert result.text.startswith("0\n")


async def test_async_turn_reaches_the_listed_host(origin_port):
    """acall starts the proxy with the sandbox, as call does, and aclose ends it."""
    executor = _executor(origin_port, [f"pkgs.test:{origin_port}"])
    async with executor.turn() as turn:
        result = await turn.acall("bash", {"command": f"curl -sS http://pkgs.test:{origin_port}/"})
    assert result.text == f"hello, pkgs.test:{origin_port}\n[exit code 0]"


@pytest.mark.slow
def test_pip_installs_system_wide_with_the_eval_relaxations(tmp_path):
    """With a writable root and root identity, pip installs into /usr/local through the proxy."""
    import functools
    from http.server import SimpleHTTPRequestHandler

    from ..conformance.test_network_allow import _package_index

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            """Keep test output quiet."""

    _package_index(tmp_path)
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = int(server.server_address[1])
    registry = Registry()
    registry.add_builtin("bash")
    fetcher = Fetcher(
        EgressPolicy(allow=[AllowRule(network="127.0.0.1/32", ports=[port])]), resolver=_Names()
    )
    executor = Executor(
        registry,
        sandbox="bubblewrap",
        fetcher=fetcher,
        network_allow=[f"pkgs.test:{port}"],
        writable_root=True,
        root_identity=True,
    )
    command = (
        "python3 -m pip install -q --break-system-packages --disable-pip-version-check "
        f"--no-cache-dir --trusted-host pkgs.test --index-url http://pkgs.test:{port}/simple/ "
        "tinypkg 2>/dev/null && cd / && python3 -c 'import tinypkg; print(tinypkg.__file__)'"
    )
    try:
        with executor.turn() as turn:
            result = turn.call("bash", {"command": command})
    finally:
        server.shutdown()
        server.server_close()
    assert result.text.startswith("/usr/local/lib/python3"), result.text
    assert "/tinypkg/__init__.py" in result.text


def _egress_threads() -> int:
    return sum(t.name == "astralvessel-egress" for t in threading.enumerate())


def test_warm_turns_bring_their_own_proxy(origin_port, long_tmp):
    """A warm sandbox is started with a proxy of its own, which the turn taking it then owns
    (the host's temporary folder far longer than a socket's address, as on many CI runners)."""
    before = _egress_threads()
    with _executor(origin_port, [f"pkgs.test:{origin_port}"], warm=2) as executor:
        assert executor.wait_warm(120)
        assert _egress_threads() == before + 2
        turn = executor.turn()
        result = turn.call("bash", {"command": f"curl -sS http://pkgs.test:{origin_port}/"})
        proxy = turn._proxy
        turn.close()
        assert proxy is not None
        assert proxy.folder.parent == long_tmp
        assert not proxy.folder.exists()
    assert result.text == f"hello, pkgs.test:{origin_port}\n[exit code 0]"
    assert _egress_threads() == before

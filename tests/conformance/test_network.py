"""Promise: no network, only an unconfigured loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from .calls import py_json


@pytest.fixture
def host_listener() -> Iterator[socket.socket]:
    """A TCP port listening on the host's loopback, as a local service would be."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    try:
        yield server
    finally:
        server.close()


def test_cannot_reach_host_loopback(session, host_listener):
    """A call cannot connect to a port the host opened on its own loopback."""
    port = host_listener.getsockname()[1]
    result = py_json(
        session,
        f"""
        import json, socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3)
            print(json.dumps("connected"))
        except OSError as exc:
            print(json.dumps(type(exc).__name__))
        """,
    )
    assert result != "connected"
    with pytest.raises(BlockingIOError):
        host_listener.accept()


@pytest.mark.parametrize("address", ["1.1.1.1", "10.0.0.1", "2606:4700:4700::1111"])
def test_cannot_reach_outside_address(session, address):
    """A call cannot connect to any outside address: there is no route at all."""
    result = py_json(
        session,
        f"""
        import json, socket
        try:
            socket.create_connection(({address!r}, 53), timeout=3)
            print(json.dumps("connected"))
        except OSError as exc:
            print(json.dumps(exc.errno))
        """,
    )
    assert result != "connected"


def test_only_interface_is_the_sandbox_loopback(session):
    """The only network interface a call sees is the sandbox's own ``lo``: no route leaves it."""
    result = py_json(
        session,
        """
        import json, socket
        names = [name for _index, name in socket.if_nameindex()]
        routes = open("/proc/net/route").read().splitlines()[1:]
        print(json.dumps({"names": names, "routes": routes}))
        """,
    )
    assert result == {"names": ["lo"], "routes": []}


def test_dns_resolution_fails(session):
    """Name resolution fails: nothing to ask, nowhere to send."""
    result = py_json(
        session,
        """
        import json, socket
        try:
            socket.getaddrinfo("pypi.org", 443)
            print(json.dumps("resolved"))
        except OSError as exc:
            print(json.dumps(str(exc)))
        """,
    )
    assert result != "resolved"

"""The egress proxy on its own: hostile request heads, the turn's bounds, and its end.

A client here speaks to the proxy's unix socket as the sandbox's relay does;
the conformance suite (``tests/conformance/test_network_allow.py``) drives the
same proxy from real calls on every backend.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from astralvessel._ground._netallow import parse_allow_list
from astralvessel.web import AllowRule, EgressPolicy
from astralvessel.web._proxy import EgressProxy
from astralvessel.web._proxyhead import (
    CHUNKED,
    ProxyLimits,
    ProxyRefusal,
    chunk_size,
    read_request,
    tunnel_refusal,
)

from .conftest import MapResolver, Server
from .reserved import reserved_spellings

LIMITS = ProxyLimits(head_seconds=1.0, connections=6, concurrent=3, total_bytes=200_000)


@pytest.fixture
def proxy(http_server: Server) -> Iterator[EgressProxy]:
    """A proxy allowing site.test on the test server's port, which the operator admits."""
    port = http_server.port
    with EgressProxy.start(
        [f"site.test:{port}", f"inner.test:{port}"],
        egress=EgressPolicy(allow=[AllowRule(network="127.0.0.1/32", ports=[port])]),
        resolver=MapResolver({"site.test": ["127.0.0.1"], "inner.test": ["192.168.1.1"]}),
        limits=LIMITS,
    ) as egress:
        yield egress


def exchange(proxy: EgressProxy, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send ``data`` to the proxy's socket and read until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        client.connect(str(proxy.socket_path))
        client.sendall(data)
        reply = b""
        while chunk := client.recv(65536):
            reply += chunk
        return reply


def test_listed_host_gets_the_page(proxy, http_server):
    """An absolute-form GET to the listed host comes back from the origin."""
    reply = exchange(
        proxy, f"GET http://site.test:{http_server.port}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    )
    assert reply.split(b"\r\n")[0] == b"HTTP/1.1 200 OK"
    assert b"<p>page /</p>" in reply


def test_host_header_is_the_urls(proxy, http_server):
    """The origin sees the URL's host in Host, whatever Host the client sent."""
    head = read_request(
        f"GET http://site.test:{http_server.port}/a?b HTTP/1.1\r\nHost: evil.test\r\n"
        "Proxy-Authorization: secret\r\n\r\n".encode(),
        proxy.allow,
        LIMITS,
    ).head
    assert head.startswith(b"GET /a?b HTTP/1.1\r\nHost: site.test:")
    assert b"evil.test" not in head
    assert b"secret" not in head
    assert head.endswith(b"Connection: close\r\n\r\n")


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason"),
    [
        (b"GET http://other.test/ HTTP/1.1\r\n\r\n", 403, b"not on this turn's network allow-list"),
        (b"CONNECT site.test:22 HTTP/1.1\r\n\r\n", 403, b"not on this turn's network allow-list"),
        (b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", 403, b"is an IP address"),
        (b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", 403, b"is an IP address"),
        (b"GET http://2130706433/ HTTP/1.1\r\n\r\n", 403, b"spells an IP address"),
        (b"GET http://u:p@site.test/ HTTP/1.1\r\n\r\n", 403, b"user-info"),
        (b"GET https://site.test/ HTTP/1.1\r\n\r\n", 400, b"CONNECT tunnel"),
        (b"GET / HTTP/1.1\r\nHost: site.test\r\n\r\n", 400, b"this is a proxy"),
        (b"FOO BAR\r\n\r\n", 400, b"request line"),
        (b"GET http://site.test/ HTTP/2.0\r\n\r\n", 400, b"request line"),
        (b"GET http://site.test/\x01 HTTP/1.1\r\n\r\n", 400, b"request target"),
        (b"GET http://site.test/ HTTP/1.1\r\nbad header\r\n\r\n", 400, b"Name: value"),
        (b"GET http://site.test/ HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, b"control characters"),
        (b"CONNECT site.test HTTP/1.1\r\n\r\n", 400, b"names no port"),
        (b"CONNECT site.test:99999 HTTP/1.1\r\n\r\n", 400, b"not a number"),
    ],
)
def test_refusals_name_their_reason(proxy, request_bytes, status, reason):
    """Each request the proxy will not serve gets its status and a reason, and nothing else."""
    reply = exchange(proxy, request_bytes)
    assert reply.split(b"\r\n")[0].startswith(f"HTTP/1.1 {status} ".encode())
    assert reason in reply
    assert reply.count(b"\r\n\r\n") == 1


def test_name_resolving_to_a_private_address_is_refused(proxy, http_server):
    """A listed name whose answer is private is refused, naming the address: no rebinding."""
    reply = exchange(proxy, f"CONNECT inner.test:{http_server.port} HTTP/1.1\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 403 ")
    assert b"192.168.1.1, which is a private address" in reply


@pytest.fixture
def v6_proxy(http_server: Server) -> Iterator[EgressProxy]:
    """A proxy with the default bounds whose resolver the test sets (inner.test)."""
    port = http_server.port
    with EgressProxy.start([f"inner.test:{port}"], resolver=MapResolver({})) as egress:
        yield egress


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(spelling=reserved_spellings())
def test_reserved_ipv6_answers_are_refused_before_any_connection(v6_proxy, http_server, spelling):
    """A listed name whose DNS answer is a reserved IPv6 address, in any spelling, gets 403
    (not a connection attempt's 502), for plain requests and tunnels alike."""
    proxy = v6_proxy
    proxy.resolver.answers["inner.test"] = [spelling]
    port = http_server.port
    for request in (
        f"CONNECT inner.test:{port} HTTP/1.1\r\n\r\n",
        f"GET http://inner.test:{port}/ HTTP/1.1\r\n\r\n",
    ):
        reply = exchange(proxy, request.encode())
        assert reply.startswith(b"HTTP/1.1 403 "), reply
        assert b"inner.test resolves to" in reply


def test_smuggling_framing_is_refused(proxy, http_server):
    """A request with both Content-Length and Transfer-Encoding is refused (400)."""
    reply = exchange(
        proxy,
        f"POST http://site.test:{http_server.port}/ HTTP/1.1\r\nContent-Length: 3\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode(),
    )
    assert reply.startswith(b"HTTP/1.1 400 ")


def test_too_many_header_fields_are_refused(proxy):
    """A head with more fields than the bound gets 431."""
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(LIMITS.head_fields + 1))
    reply = exchange(proxy, b"GET http://site.test/ HTTP/1.1\r\n" + fields + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 431 ")


def test_endless_head_is_refused(proxy):
    """A head longer than the bound gets 431 before the proxy reads any further."""
    reply = exchange(proxy, b"GET http://site.test/ HTTP/1.1\r\nX: " + b"a" * 40_000)
    assert reply.startswith(b"HTTP/1.1 431 ")


def test_slowloris_is_cut_off(proxy):
    """A head that trickles in never completes: 408 once the head's time is up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(proxy.socket_path))
        client.sendall(b"GET http://site.test/ HTTP/1.1\r\n")
        client.setblocking(False)
        reply = b""
        deadline = time.monotonic() + 20
        while not reply.endswith(b"\n") and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                client.sendall(b"X: 1\r\n")  # one more field, never the blank line
            time.sleep(0.05)
            with contextlib.suppress(BlockingIOError):
                reply += client.recv(65536)
    assert reply.startswith(b"HTTP/1.1 408 ")


def test_turn_connection_budget(proxy, http_server):
    """Once the turn's connections are spent, the next gets 503 saying so."""
    request = f"GET http://site.test:{http_server.port}/ HTTP/1.1\r\n\r\n".encode()
    for _ in range(LIMITS.connections):
        exchange(proxy, request)
    reply = exchange(proxy, request)
    assert reply.startswith(b"HTTP/1.1 503 ")
    assert b"used all its 6 connections" in reply


def test_concurrent_connection_bound(proxy, http_server):
    """More connections at once than the bound: the extra one gets 503 at once."""
    held = []
    try:
        for _ in range(LIMITS.concurrent):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(str(proxy.socket_path))
            held.append(client)
        deadline = time.monotonic() + 10
        while proxy.counters.active < LIMITS.concurrent and time.monotonic() < deadline:
            time.sleep(0.01)
        request = f"GET http://site.test:{http_server.port}/ HTTP/1.1\r\n\r\n"
        reply = exchange(proxy, request.encode())
    finally:
        for client in held:
            client.close()
    assert reply.startswith(b"HTTP/1.1 503 ")
    assert b"3 connections open" in reply


def test_turn_byte_budget(http_server):
    """A turn that has moved its bytes gets 503 for its next connection."""
    port = http_server.port
    with EgressProxy.start(
        [f"site.test:{port}"],
        egress=EgressPolicy(allow=[AllowRule(network="127.0.0.1/32", ports=[port])]),
        resolver=MapResolver({"site.test": ["127.0.0.1"]}),
        limits=ProxyLimits(total_bytes=100),
    ) as proxy:
        request = f"GET http://site.test:{port}/ HTTP/1.1\r\n\r\n".encode()
        first = exchange(proxy, request)
        second = exchange(proxy, request)
    assert len(first) <= 100 + 65536
    assert second.startswith(b"HTTP/1.1 503 ")
    assert b"moved all its 100 bytes" in second


def test_close_ends_open_tunnels_and_the_thread(http_server):
    """Closing the proxy ends a tunnel in use, removes its socket folder and stops its thread."""
    port = http_server.port
    proxy = EgressProxy.start(
        [f"site.test:{port}"],
        egress=EgressPolicy(allow=[AllowRule(network="127.0.0.1/32", ports=[port])]),
        resolver=MapResolver({"site.test": ["127.0.0.1"]}),
    )
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(proxy.socket_path))
    client.sendall(f"CONNECT site.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert client.recv(4096).startswith(b"HTTP/1.1 200 ")
    proxy.close()
    assert client.recv(4096) == b""
    client.close()
    assert not proxy.folder.exists()
    # This proxy's own thread: in a whole-suite run other proxies may still be closing.
    assert not proxy._thread.is_alive()


def test_many_turns_at_once(http_server):
    """Twenty proxies, one per turn, each serve their own requests at once."""
    port = http_server.port
    proxies = [
        EgressProxy.start(
            [f"site.test:{port}"],
            egress=EgressPolicy(allow=[AllowRule(network="127.0.0.1/32", ports=[port])]),
            resolver=MapResolver({"site.test": ["127.0.0.1"]}),
        )
        for _ in range(20)
    ]
    replies: list[bytes] = []
    request = f"GET http://site.test:{port}/ HTTP/1.1\r\n\r\n".encode()
    try:
        threads = [
            threading.Thread(target=lambda p=p: replies.append(exchange(p, request)))
            for p in proxies
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        for proxy in proxies:
            proxy.close()
    assert len(replies) == 20
    assert all(b"<p>page /</p>" in reply for reply in replies)


def test_read_request_refuses_a_head_without_its_blank_line():
    """A head that does not end in CRLF CRLF is refused by the pure reader."""
    with pytest.raises(ProxyRefusal) as info:
        read_request(b"GET http://site.test/ HTTP/1.1\r\n", (), LIMITS)
    assert info.value.status == 400


def test_close_during_a_hung_name_lookup_stops_the_thread():
    """A lookup that never returns (a DNS server that does not answer) does not keep the thread."""
    entered, release = threading.Event(), threading.Event()

    def hang(_earlier: int) -> list[str]:
        entered.set()
        release.wait(60)
        return ["127.0.0.1"]

    proxy = EgressProxy.start(["slow.test:443"], resolver=MapResolver({"slow.test": hang}))
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.settimeout(10)
        client.connect(str(proxy.socket_path))
        client.sendall(b"CONNECT slow.test:443 HTTP/1.1\r\n\r\n")
        assert entered.wait(10)
        proxy.close()
        assert not proxy._thread.is_alive()
        assert client.recv(4096) == b""
    finally:
        release.set()
        client.close()
        proxy.close()


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (b"CONNECT site.test:80 HTTP/1.1\r\n\r\n", "CONNECT to port 80 is refused"),
        (b"POST http://site.test/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "'chunked'"),
        (
            b"POST http://site.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            "frames its body twice",
        ),
        (b"POST http://site.test/ HTTP/1.1\r\nContent-Length: +5\r\n\r\n", "not a number"),
        (b"POST http://site.test/ HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", "not a number"),
    ],
)
def test_framing_the_origin_could_read_otherwise_is_refused(head, reason):
    """A tunnel to port 80 and a body framing the proxy and the origin could read apart
    (a coding other than chunked, two framings, a length that is not digits) are refused."""
    with pytest.raises(ProxyRefusal, match=reason):
        read_request(head, parse_allow_list(["site.test"]), LIMITS)


def test_a_plain_request_says_how_long_its_body_is():
    """The proxy passes on exactly the body the head frames: none, a length, or chunks."""
    allow = parse_allow_list(["site.test"])
    framed = {
        b"": 0,
        b"Content-Length: 12\r\n": 12,
        b"transfer-encoding: Chunked\r\n": CHUNKED,
    }
    for fields, body in framed.items():
        head = b"POST http://site.test/ HTTP/1.1\r\n" + fields + b"\r\n"
        assert read_request(head, allow, LIMITS).body == body


@pytest.mark.parametrize(
    ("line", "size"),
    [(b"0\r\n", 0), (b"1a\r\n", 26), (b"FF;name=value\r\n", 255)],
)
def test_chunk_sizes(line, size):
    """A chunk's size line is hex, with an optional extension."""
    assert chunk_size(line) == size


@pytest.mark.parametrize("line", [b"\r\n", b"-1\r\n", b"0x10\r\n", b"1 \r\n", b"1\n", b"f" * 16])
def test_chunk_lines_that_could_be_read_apart_are_refused(line):
    """A size line that is not plain hex and CRLF is refused, never guessed at."""
    with pytest.raises(ProxyRefusal, match="SIZE CRLF"):
        chunk_size(line)


def test_a_tunnel_carries_only_tls():
    """A tunnel whose first bytes are a TLS handshake passes; plain HTTP is refused."""
    assert tunnel_refusal(b"\x16\x03\x01\x02\x00", "site.test", 443) is None
    refusal = tunnel_refusal(b"GET /", "site.test", 443)
    assert refusal is not None
    assert "carried no TLS" in refusal.reason


def test_refusals_are_drained_per_call_and_dropped_at_close(http_server):
    """The proxy hands its refusals over once (a call's), and keeps none past close."""
    port = http_server.port
    proxy = EgressProxy.start([f"site.test:{port}"], resolver=MapResolver({}))
    try:
        exchange(proxy, b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")
        exchange(proxy, b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")
        first = proxy.drain()
        assert [(d.host, d.port, d.count) for d in first.destinations] == [("other.test", 443, 2)]
        assert proxy.drain().total == 0
        exchange(proxy, b"NOT HTTP\r\n\r\n")
    finally:
        proxy.close()
    assert proxy.drain().total == 0

"""HttpxTransport as a resource: one reused client, a host's own client, and closing."""

from __future__ import annotations

import httpx
import pytest

from astralvessel.web import EgressPolicy, Fetcher, FetchLimits, HttpxTransport

from .conftest import HOST, LOOPBACK, TLS, MapResolver, Server


def _fetcher(transport: HttpxTransport, resolver: MapResolver) -> Fetcher:
    return Fetcher(
        EgressPolicy(allow=[LOOPBACK]),
        transport,
        resolver=resolver,
        limits=FetchLimits(timeout_seconds=10),
    )


def test_host_client_is_used_and_still_pinned(
    https_server: Server, tls: TLS, resolver: MapResolver
) -> None:
    """A host's httpx.Client carries every exchange, to the approved address, for the real name."""
    seen: list[httpx.Request] = []
    with httpx.Client(
        verify=tls.client_context(), event_hooks={"request": [seen.append]}
    ) as client:
        transport = HttpxTransport(client=client)
        fetcher = _fetcher(transport, resolver)
        for _ in range(2):
            result = fetcher.fetch(f"https://{HOST}:{https_server.port}/page")
            assert not result.is_error, result.text
        transport.close()
        assert not client.is_closed
    assert [r.url.host for r in seen] == ["127.0.0.1", "127.0.0.1"]
    assert {r.headers["Host"] for r in seen} == {f"{HOST}:{https_server.port}"}
    assert {r.extensions["sni_hostname"] for r in seen} == {HOST}


async def test_host_async_client_is_used_and_still_pinned(
    https_server: Server, tls: TLS, resolver: MapResolver
) -> None:
    """A host's httpx.AsyncClient carries every async exchange, pinned the same way."""
    seen: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        seen.append(request)

    async with httpx.AsyncClient(
        verify=tls.client_context(), event_hooks={"request": [record]}
    ) as client:
        transport = HttpxTransport(async_client=client)
        result = await _fetcher(transport, resolver).afetch(
            f"https://{HOST}:{https_server.port}/page"
        )
        assert not result.is_error, result.text
        await transport.aclose()
        assert not client.is_closed
    assert [(r.url.host, r.extensions["sni_hostname"]) for r in seen] == [("127.0.0.1", HOST)]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_connection_for_one_name_is_not_reused_for_another(
    mode: str, https_server: Server, tls: TLS, resolver: MapResolver
) -> None:
    """A kept-alive connection verified for site.test never carries a request for other.test."""
    resolver.answers["other.test"] = ["127.0.0.1"]
    async with HttpxTransport(ssl_context=tls.client_context()) as transport:
        fetcher = _fetcher(transport, resolver)
        results = []
        for host in (HOST, "other.test"):
            url = f"https://{host}:{https_server.port}/keep-alive"
            results.append(fetcher.fetch(url) if mode == "sync" else await fetcher.afetch(url))
    assert not results[0].is_error, results[0].text
    assert results[1].is_error
    assert "webfetch could not fetch" in results[1].text


def test_closed_transport_makes_a_new_client(http_server: Server, resolver: MapResolver) -> None:
    """After close(), the transport's next exchange runs on a fresh client of its own."""
    with HttpxTransport() as transport:
        fetcher = _fetcher(transport, resolver)
        assert not fetcher.fetch(f"http://{HOST}:{http_server.port}/page").is_error
        transport.close()
        result = fetcher.fetch(f"http://{HOST}:{http_server.port}/page")
    assert not result.is_error, result.text

"""The custom transport shown in docs/web.md works as written, over real TLS."""

from __future__ import annotations

import ssl

import urllib3

from astralvessel.web import EgressPolicy, Fetcher, HttpRequest, HttpResponse

from .conftest import HOST, LOOPBACK, TLS, MapResolver, Server


class Urllib3Transport:
    """The docs' example, with an SSL context added for the test certificate."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context

    def send(self, request: HttpRequest) -> HttpResponse:
        """One exchange with urllib3, to the approved address, verified against the host name."""
        pool = urllib3.connection_from_url(
            f"{request.scheme}://{request.address}:{request.port}",
            server_hostname=request.host,
            assert_hostname=request.host,
            ssl_context=self.context,
        )
        response = pool.urlopen(
            request.method,
            request.target,
            headers=dict(request.headers) | {"Host": request.host},
            redirect=False,
            retries=False,
            preload_content=False,
            decode_content=False,
            timeout=request.remaining(),
        )
        return HttpResponse(
            status=response.status,
            headers=tuple(response.headers.items()),
            chunks=response.stream(65536),
            close=response.release_conn,
        )


def test_docs_transport_fetches_over_tls(https_server: Server, tls: TLS) -> None:
    """A host-written transport in a few lines gets the whole policy and conversion for free."""
    fetcher = Fetcher(
        EgressPolicy(allow=[LOOPBACK]),
        Urllib3Transport(tls.client_context()),
        resolver=MapResolver({HOST: ["127.0.0.1"]}),
    )
    result = fetcher.fetch(f"https://{HOST}:{https_server.port}/gzip")
    assert not result.is_error, result.text
    assert "Otters live in" in result.text

"""A transport over httpx (the ``httpx`` extra), for hosts that already use it.

It asks httpx for a URL whose host is the approved address, and passes the
real host name as the Host header and as the TLS server name (httpcore's
``sni_hostname`` extension), so the certificate is checked against the name
while the connection goes to the address. Redirects, cookies, proxies from
the environment and automatic decompression are all off: the `Fetcher`
does those itself, under its limits.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from ._transport import AsyncHttpResponse, HttpRequest, HttpResponse, TransportError

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpxTransport"]


def _import_httpx() -> object:
    try:
        import httpx  # optional dependency, imported on first use
    except ImportError:
        raise ImportError(
            "HttpxTransport needs httpx: install astralvessel[httpx] (or pip install httpx)"
        ) from None
    return httpx


class HttpxTransport:
    """Performs each exchange with a fresh httpx client, sync or async."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        _import_httpx()
        self._verify: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True

    def _build(self, request: HttpRequest) -> tuple[str, dict[str, str], dict[str, object]]:
        address = f"[{request.address}]" if ":" in request.address else request.address
        url = f"{request.scheme}://{address}:{request.port}{request.target}"
        default = {"http": 80, "https": 443}[request.scheme]
        host = f"[{request.host}]" if ":" in request.host else request.host
        headers = dict(request.headers)
        headers["Host"] = host if request.port == default else f"{host}:{request.port}"
        extensions: dict[str, object] = {}
        if request.scheme == "https":
            extensions["sni_hostname"] = request.host
        return url, headers, extensions

    def _timeout(self, request: HttpRequest) -> httpx.Timeout:
        import httpx

        return httpx.Timeout(request.remaining())

    def send(self, request: HttpRequest) -> HttpResponse:
        """Send one request with httpx and stream the raw body."""
        import httpx

        url, headers, extensions = self._build(request)
        client = httpx.Client(verify=self._verify, trust_env=False, follow_redirects=False)
        try:
            built = client.build_request(
                request.method,
                url,
                headers=headers,
                content=request.body or None,
                extensions={**extensions, "timeout": self._timeout(request).as_dict()},
            )
            response = client.send(built, stream=True)
        except httpx.TimeoutException as error:
            client.close()
            raise TimeoutError(str(error) or "the exchange timed out") from None
        except httpx.HTTPError as error:
            client.close()
            raise TransportError(str(error) or type(error).__name__) from None

        def chunks() -> Iterator[bytes]:
            try:
                yield from response.iter_raw()
            except httpx.TimeoutException as error:
                raise TimeoutError(str(error) or "the exchange timed out") from None
            except httpx.HTTPError as error:
                raise TransportError(str(error) or type(error).__name__) from None

        def close() -> None:
            response.close()
            client.close()

        return HttpResponse(
            status=response.status_code,
            reason=response.reason_phrase,
            headers=tuple(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw
            ),
            chunks=chunks(),
            close=close,
        )

    async def asend(self, request: HttpRequest) -> AsyncHttpResponse:
        """Send one request with httpx's async client and stream the raw body."""
        import httpx

        url, headers, extensions = self._build(request)
        client = httpx.AsyncClient(verify=self._verify, trust_env=False, follow_redirects=False)
        try:
            built = client.build_request(
                request.method,
                url,
                headers=headers,
                content=request.body or None,
                extensions={**extensions, "timeout": self._timeout(request).as_dict()},
            )
            response = await client.send(built, stream=True)
        except httpx.TimeoutException as error:
            await client.aclose()
            raise TimeoutError(str(error) or "the exchange timed out") from None
        except httpx.HTTPError as error:
            await client.aclose()
            raise TransportError(str(error) or type(error).__name__) from None

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            except httpx.TimeoutException as error:
                raise TimeoutError(str(error) or "the exchange timed out") from None
            except httpx.HTTPError as error:
                raise TransportError(str(error) or type(error).__name__) from None

        async def aclose() -> None:
            await response.aclose()
            await client.aclose()

        return AsyncHttpResponse(
            status=response.status_code,
            reason=response.reason_phrase,
            headers=tuple(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw
            ),
            chunks=chunks(),
            aclose=aclose,
        )

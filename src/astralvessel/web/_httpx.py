"""A transport over httpx (the ``httpx`` extra), for hosts that already use it.

It asks httpx for a URL whose host is the approved address, and passes the
real host name as the Host header and as the TLS server name (httpcore's
``sni_hostname`` extension), so the certificate is checked against the name
while the connection goes to the address. Redirects, cookies, proxies from
the environment and automatic decompression are all off: the `Fetcher`
does those itself, under its limits.

The transport keeps one `httpx.Client` and one `httpx.AsyncClient`, made on
first use (or given by the host, already configured with its certificates,
proxies or limits), and closes the ones it made in ``close()`` / ``aclose()``.
Every exchange still asks for ``Connection: close``: a pooled connection is
keyed by address, and one verified for one name must never carry a request
for another name served from the same address.

The exchange is one flow (see ``_flow.py``) over two steps, `_Send` and
`_Read`; `_Sync` and `_Async` perform them with the two clients.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from .._ground._suggest import install_extra
from ..errors import UsageError
from . import _flow
from ._flow import APerform, Emit, Flow, Perform, Step
from ._transport import AsyncHttpResponse, HttpRequest, HttpResponse, TransportError

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpxTransport"]


def _import_httpx() -> Any:
    try:
        import httpx  # optional dependency, imported on first use
    except ImportError:
        raise ImportError(
            f"HttpxTransport needs httpx: {install_extra('httpx')}, or pip install httpx"
        ) from None
    return httpx


@attrs.frozen
class _Send(Step["httpx.Response"]):
    """Send the built request and return once the response head is in."""

    request: httpx.Request


@attrs.frozen
class _Read(Step["bytes | None"]):
    """The next raw body chunk; ``None`` at the end."""


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """Turn httpx's errors into the transport contract's: `TimeoutError` or `TransportError`."""
    import httpx

    try:
        yield
    except httpx.TimeoutException as error:
        raise TimeoutError(str(error) or "the exchange timed out") from None
    except httpx.ConnectError as error:
        # The sync and async backends word a refused connection differently, and hide its
        # errno; raise the socket's own error, so the model reads the same words from fetch
        # and afetch, and the Fetcher can try the next approved address.
        cause = _socket_error(error)
        if cause is None:
            raise TransportError(str(error) or type(error).__name__) from None
        raise OSError(cause, os.strerror(cause)) from None
    except httpx.HTTPError as error:
        raise TransportError(str(error) or type(error).__name__) from None


def _socket_error(error: BaseException) -> int | None:
    """The errno of the socket error behind ``error``, if one is in its chain (TLS aside)."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, OSError) and not isinstance(seen, ssl.SSLError) and seen.errno:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    return None


def _exchange(request: httpx.Request) -> Flow[httpx.Response]:
    with _translated():
        return (yield from _Send(request))


def _body() -> Flow[None]:
    with _translated():
        while (chunk := (yield from _Read())) is not None:
            yield from Emit(chunk)


def _headers(response: httpx.Response) -> tuple[tuple[str, str], ...]:
    return tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw)


class HttpxTransport:
    """Performs each exchange with one reused httpx client, sync or async.

    Pass ``client`` / ``async_client`` to use clients the host configured
    (mutual TLS, an outbound proxy, connection limits); their transport
    settings apply, while their default headers, cookies, auth, base URL and
    redirect setting do not: the `Fetcher` decides the request. A client the
    host passed stays the host's to close. ``ssl_context`` configures the
    clients this transport makes itself.
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        client: httpx.Client | None = None,
        async_client: httpx.AsyncClient | None = None,
    ) -> None:
        _import_httpx()
        if ssl_context is not None and (client is not None or async_client is not None):
            raise UsageError("pass ssl_context or clients, not both: a client has its own TLS")
        self._verify: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._client = client
        self._async_client = async_client
        self._owns_client = client is None
        self._owns_async_client = async_client is None
        self._lock = threading.Lock()

    # -- resources --------------------------------------------------------------------------

    # Calls of one turn may run in several threads at once; the lock makes sure they all
    # share the one client made on first use, rather than each making (and leaking) its own.

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = _import_httpx().Client(verify=self._verify, trust_env=False)
            return self._client

    def _async_client_now(self) -> httpx.AsyncClient:
        with self._lock:
            if self._async_client is None:
                self._async_client = _import_httpx().AsyncClient(
                    verify=self._verify, trust_env=False
                )
            return self._async_client

    def close(self) -> None:
        """Close the sync client this transport made; a later exchange makes a new one."""
        with self._lock:
            client, self._client = self._client, (None if self._owns_client else self._client)
        if self._owns_client and client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close both clients this transport made."""
        self.close()
        with self._lock:
            client = self._async_client
            if self._owns_async_client:
                self._async_client = None
        if self._owns_async_client and client is not None:
            await client.aclose()

    def __enter__(self) -> HttpxTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> HttpxTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the exchange -----------------------------------------------------------------------

    def _build(self, request: HttpRequest) -> httpx.Request:
        """The httpx request: to the approved address, for the real name in Host and TLS."""
        lib = _import_httpx()
        address = f"[{request.address}]" if ":" in request.address else request.address
        default = {"http": 80, "https": 443}[request.scheme]
        host = f"[{request.host}]" if ":" in request.host else request.host
        headers = dict(request.headers)
        headers["Host"] = host if request.port == default else f"{host}:{request.port}"
        headers["Connection"] = "close"
        extensions: dict[str, object] = {"timeout": lib.Timeout(request.remaining()).as_dict()}
        if request.scheme == "https":
            extensions["sni_hostname"] = request.host
        built: httpx.Request = lib.Request(
            request.method,
            f"{request.scheme}://{address}:{request.port}{request.target}",
            headers=headers,
            content=request.body or None,
            extensions=extensions,
        )
        return built

    def send(self, request: HttpRequest) -> HttpResponse:
        """Send one request with the sync client and stream the raw body."""
        io = _Sync(self._sync_client())
        response = _flow.run(_exchange(self._build(request)), io.perform)
        return HttpResponse(
            status=response.status_code,
            reason=response.reason_phrase,
            headers=_headers(response),
            chunks=_flow.iterate(_body(), io.perform),
            close=response.close,
        )

    async def asend(self, request: HttpRequest) -> AsyncHttpResponse:
        """Send one request with the async client and stream the raw body."""
        io = _Async(self._async_client_now())
        response = await _flow.arun(_exchange(self._build(request)), io.perform)
        chunks = _flow.aiterate(_body(), io.perform)
        return AsyncHttpResponse(
            status=response.status_code,
            reason=response.reason_phrase,
            headers=_headers(response),
            chunks=chunks,
            aclose=_flow.aclosing_body(chunks, response.aclose),
        )


class _Sync:
    """Performs the steps with an `httpx.Client`."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client
        self._raw: Iterator[bytes] = iter(())
        self.perform: Perform = {_Send: self._send, _Read: self._read}

    def _send(self, step: _Send) -> httpx.Response:
        response = self._client.send(step.request, stream=True, auth=None, follow_redirects=False)
        self._raw = response.iter_raw()
        return response

    def _read(self, step: _Read) -> bytes | None:
        return next(self._raw, None)


class _Async:
    """Performs the steps with an `httpx.AsyncClient`."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        self._raw: AsyncIterator[bytes] | None = None
        self.perform: APerform = {_Send: self._send, _Read: self._read}

    async def _send(self, step: _Send) -> httpx.Response:
        response = await self._client.send(
            step.request, stream=True, auth=None, follow_redirects=False
        )
        self._raw = response.aiter_raw()
        return response

    async def _read(self, step: _Read) -> bytes | None:
        return None if self._raw is None else await anext(self._raw, None)

"""The default transports, built on the standard library only.

`StdlibTransport` opens a TCP connection to the approved address (TLS with
the URL's host name as server name and for the certificate check), sends one
request and streams the response. `ProxyTransport` does the same through an
operator's HTTP proxy: it asks the proxy for a ``CONNECT`` tunnel to the
approved address, never to a name, so the proxy cannot resolve it elsewhere.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterator
from urllib.parse import unquote, urlsplit

from ._http1 import ResponseReader, format_request
from ._transport import AsyncHttpResponse, HttpRequest, HttpResponse, TransportError

__all__ = ["ProxyTransport", "StdlibTransport"]

_READ_SIZE = 65536


class StdlibTransport:
    """Sends one request straight to the approved address, sync or async.

    ``ssl_context`` defaults to the system's trusted certificates with host
    name checking on; pass one that trusts a private CA for tests or an
    internal deployment.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings used for https requests."""
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    # -- sync -------------------------------------------------------------------------------

    def _connect(self, request: HttpRequest) -> socket.socket:
        return socket.create_connection(
            (request.address, request.port), timeout=request.remaining()
        )

    def send(self, request: HttpRequest) -> HttpResponse:
        """Connect, send, and return once the response head is in."""
        sock = self._connect(request)
        try:
            if request.scheme == "https":
                sock.settimeout(request.remaining())
                sock = self.ssl_context.wrap_socket(sock, server_hostname=request.host)
            sock.settimeout(request.remaining())
            sock.sendall(format_request(request))
            reader = ResponseReader(
                method=request.method, max_header_bytes=request.max_header_bytes
            )
            _fill_head(sock, reader, request)
        except BaseException:
            sock.close()
            raise
        head = reader.head
        if head is None:  # pragma: no cover - _fill_head returns only with a head
            raise TransportError("the server closed the connection without answering")
        return HttpResponse(
            status=head.status,
            reason=head.reason,
            headers=head.headers,
            chunks=_body_chunks(sock, reader, request),
            close=sock.close,
        )

    # -- async ------------------------------------------------------------------------------

    async def _aconnect(
        self, request: HttpRequest
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(
            asyncio.open_connection(request.address, request.port), request.remaining()
        )

    async def asend(self, request: HttpRequest) -> AsyncHttpResponse:
        """Connect, send, and return once the response head is in."""
        stream, writer = await self._aconnect(request)
        try:
            if request.scheme == "https":
                stream, writer = await _astart_tls(stream, writer, self.ssl_context, request)
            writer.write(format_request(request))
            await asyncio.wait_for(writer.drain(), request.remaining())
            reader = ResponseReader(
                method=request.method, max_header_bytes=request.max_header_bytes
            )
            await _afill_head(stream, reader, request)
        except BaseException:
            _abort(writer)
            raise

        async def aclose() -> None:
            _abort(writer)

        head = reader.head
        if head is None:  # pragma: no cover - _afill_head returns only with a head
            raise TransportError("the server closed the connection without answering")
        return AsyncHttpResponse(
            status=head.status,
            reason=head.reason,
            headers=head.headers,
            chunks=_abody_chunks(stream, reader, request),
            aclose=aclose,
        )


class ProxyTransport(StdlibTransport):
    """Sends each exchange through an operator's HTTP proxy as a ``CONNECT`` tunnel.

    ``proxy`` is ``http://[user:password@]host:port``; the proxy is the
    operator's own and is not subject to the egress policy, but the tunnel it
    opens always goes to the approved address and port.
    """

    def __init__(self, proxy: str, *, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(ssl_context=ssl_context)
        parts = urlsplit(proxy)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"proxy {proxy!r} must be an http://host:port URL")
        self._proxy_host = parts.hostname
        self._proxy_port = parts.port or 80
        self._auth: str | None = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self._auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")

    def _connect_request(self, request: HttpRequest) -> bytes:
        authority = (
            f"[{request.address}]:{request.port}"
            if ":" in request.address
            else f"{request.address}:{request.port}"
        )
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        if self._auth:
            lines.append(f"Proxy-Authorization: {self._auth}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _connect(self, request: HttpRequest) -> socket.socket:
        sock = socket.create_connection(
            (self._proxy_host, self._proxy_port), timeout=request.remaining()
        )
        try:
            sock.sendall(self._connect_request(request))
            _check_connect_answer(_read_connect_answer(sock, request))
        except BaseException:
            sock.close()
            raise
        return sock

    async def _aconnect(
        self, request: HttpRequest
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        stream, writer = await asyncio.wait_for(
            asyncio.open_connection(self._proxy_host, self._proxy_port), request.remaining()
        )
        try:
            writer.write(self._connect_request(request))
            await asyncio.wait_for(writer.drain(), request.remaining())
            try:
                head = await asyncio.wait_for(stream.readuntil(b"\r\n\r\n"), request.remaining())
            except asyncio.IncompleteReadError:
                raise TransportError("the proxy closed the connection during CONNECT") from None
            except asyncio.LimitOverrunError:
                raise TransportError("the proxy's CONNECT answer is too large") from None
            _check_connect_answer(head)
        except BaseException:
            _abort(writer)
            raise
        return stream, writer


def _read_connect_answer(sock: socket.socket, request: HttpRequest) -> bytes:
    # Read byte-wise up to the end of the proxy's head so no tunnel bytes are consumed.
    head = bytearray()
    while not head.endswith(b"\r\n\r\n") and not head.endswith(b"\n\n"):
        sock.settimeout(request.remaining())
        byte = sock.recv(1)
        if not byte:
            raise TransportError("the proxy closed the connection during CONNECT")
        head += byte
        if len(head) > request.max_header_bytes:
            raise TransportError("the proxy's CONNECT answer is too large")
    return bytes(head)


async def _afill_head(
    stream: asyncio.StreamReader, reader: ResponseReader, request: HttpRequest
) -> None:
    while reader.head is None:
        data = await asyncio.wait_for(stream.read(_READ_SIZE), request.remaining())
        if not data:
            reader.feed_eof()
            raise TransportError("the server closed the connection without answering")
        reader.feed(data)


def _abort(writer: asyncio.StreamWriter) -> None:
    # One exchange, then done: drop the connection at once. A polite TLS close would need
    # the event loop to keep running, and it may be gone before the peer answers.
    writer.transport.abort()


def _check_connect_answer(head: bytes) -> None:
    status_line = head.split(b"\n", 1)[0].strip().decode("latin-1", "replace")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit() or not parts[1].startswith("2"):
        raise TransportError(f"the proxy refused the tunnel: {status_line[:200]!r}")


async def _astart_tls(
    stream: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    context: ssl.SSLContext,
    request: HttpRequest,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if sys.version_info >= (3, 11):
        await asyncio.wait_for(
            writer.start_tls(context, server_hostname=request.host), request.remaining()
        )
        return stream, writer
    # Python 3.10 streams cannot upgrade in place: rebuild them over the TLS transport.
    loop = asyncio.get_running_loop()  # pragma: no cover - exercised on 3.10 only
    transport = writer.transport  # pragma: no cover
    protocol = transport.get_protocol()  # pragma: no cover
    new_transport = await asyncio.wait_for(  # pragma: no cover
        loop.start_tls(transport, protocol, context, server_hostname=request.host),
        request.remaining(),
    )
    new_stream = asyncio.StreamReader()  # pragma: no cover
    new_protocol = asyncio.StreamReaderProtocol(new_stream)  # pragma: no cover
    if new_transport is None:  # pragma: no cover
        raise TransportError("TLS could not start over the connection")
    new_transport.set_protocol(new_protocol)  # pragma: no cover
    new_protocol.connection_made(new_transport)  # pragma: no cover
    return new_stream, asyncio.StreamWriter(new_transport, new_protocol, new_stream, loop)


def _fill_head(sock: socket.socket, reader: ResponseReader, request: HttpRequest) -> None:
    while reader.head is None:
        sock.settimeout(request.remaining())
        data = sock.recv(_READ_SIZE)
        if not data:
            reader.feed_eof()
            raise TransportError("the server closed the connection without answering")
        reader.feed(data)


def _body_chunks(
    sock: socket.socket, reader: ResponseReader, request: HttpRequest
) -> Iterator[bytes]:
    try:
        while True:
            data = reader.take_body()
            if data:
                yield data
            if reader.done:
                return
            sock.settimeout(request.remaining())
            received = sock.recv(_READ_SIZE)
            if received:
                reader.feed(received)
            else:
                reader.feed_eof()
    finally:
        sock.close()


async def _abody_chunks(
    stream: asyncio.StreamReader, reader: ResponseReader, request: HttpRequest
) -> AsyncIterator[bytes]:
    while True:
        data = reader.take_body()
        if data:
            yield data
        if reader.done:
            return
        received = await asyncio.wait_for(stream.read(_READ_SIZE), request.remaining())
        if received:
            reader.feed(received)
        else:
            reader.feed_eof()

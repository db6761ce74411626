"""The default transports, built on the standard library only.

`StdlibTransport` opens a TCP connection to the approved address (TLS with
the URL's host name as server name and for the certificate check), sends one
request and streams the response. `ProxyTransport` does the same through an
operator's HTTP proxy: it asks the proxy for a ``CONNECT`` tunnel to the
approved address, never to a name, so the proxy cannot resolve it elsewhere.

The exchange is written once, as flows (see ``_flow.py``) over four socket
steps: `Connect`, `StartTLS`, `Write` and `Recv`. `_Socket` performs them on
a blocking socket and `_Stream` on an anyio stream (asyncio or trio); every
read and write is bounded by the request's deadline.
"""

from __future__ import annotations

import base64
import errno
import ipaddress
import os
import socket
import ssl
from urllib.parse import unquote, urlsplit

import anyio
import anyio.abc
import attrs
from anyio.streams.tls import TLSStream

from .._ground._aio import shielded, time_limit
from ..errors import UsageError
from . import _flow
from ._flow import APerform, Emit, Flow, Perform, Step
from ._http1 import ResponseReader, format_request
from ._transport import AsyncHttpResponse, HttpRequest, HttpResponse, TransportError

__all__ = ["ProxyTransport", "StdlibTransport"]

_READ_SIZE = 65536


# -- the steps, and the flows over them --------------------------------------------------------


@attrs.frozen
class Connect(Step[None]):
    """Open a TCP connection to ``host`` (an address, or the operator's proxy) and ``port``."""

    host: str
    port: int


@attrs.frozen
class StartTLS(Step[None]):
    """Wrap the connection in TLS for ``server_hostname``, checking its certificate."""

    context: ssl.SSLContext
    server_hostname: str


@attrs.frozen
class Write(Step[None]):
    """Send all of ``data``."""

    data: bytes


@attrs.frozen
class Recv(Step[bytes]):
    """Receive at most ``size`` bytes; ``b""`` when the peer has closed."""

    size: int = _READ_SIZE


def _body(reader: ResponseReader) -> Flow[None]:
    """Emit the body as the reader decodes it, until the response ends."""
    while True:
        data = reader.take_body()
        if data:
            yield from Emit(data)
        if reader.done:
            return
        received = yield from Recv()
        if received:
            reader.feed(received)
        else:
            reader.feed_eof()


class StdlibTransport:
    """Sends one request straight to the approved address, sync or async.

    ``ssl_context`` defaults to the system's trusted certificates with host
    name checking on; pass one that trusts a private CA for tests or an
    internal deployment. It holds no connection between exchanges, so
    ``close()`` has nothing to release; it exists so that every shipped
    transport can be used as a context manager.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings used for https requests."""
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    def close(self) -> None:
        """Release nothing: each exchange's connection ends with its response."""

    def __enter__(self) -> StdlibTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, request: HttpRequest) -> HttpResponse:
        """Connect, send, and return once the response head is in."""
        connection = _Socket(request)
        try:
            reader = _flow.run(self._exchange(request), connection.perform)
        except BaseException:
            connection.close()
            raise
        head = reader.head
        assert head is not None  # noqa: S101 - _exchange returns only with a head
        return HttpResponse(
            status=head.status,
            reason=head.reason,
            headers=head.headers,
            chunks=_flow.iterate(_body(reader), connection.perform),
            close=connection.close,
        )

    async def asend(self, request: HttpRequest) -> AsyncHttpResponse:
        """Connect, send, and return once the response head is in."""
        connection = _Stream(request)
        try:
            reader = await _flow.arun(self._exchange(request), connection.perform)
        except BaseException:
            await connection.aclose()
            raise
        head = reader.head
        assert head is not None  # noqa: S101 - _exchange returns only with a head
        chunks = _flow.aiterate(_body(reader), connection.perform)
        return AsyncHttpResponse(
            status=head.status,
            reason=head.reason,
            headers=head.headers,
            chunks=chunks,
            aclose=_flow.aclosing_body(chunks, connection.aclose),
        )

    def _exchange(self, request: HttpRequest) -> Flow[ResponseReader]:
        """Connect, start TLS for https, send the request and read up to the end of the head."""
        yield from self._connect(request)
        if request.scheme == "https":
            yield from StartTLS(self.ssl_context, request.host)
        yield from Write(format_request(request))
        reader = ResponseReader(method=request.method, max_header_bytes=request.max_header_bytes)
        while reader.head is None:
            data = yield from Recv()
            if not data:
                reader.feed_eof()
                raise TransportError("the server closed the connection without answering")
            reader.feed(data)
        return reader

    def _connect(self, request: HttpRequest) -> Flow[None]:
        yield from Connect(request.address, request.port)


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
            raise UsageError(f"proxy {proxy!r} must be an http://host:port URL")
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

    def _connect(self, request: HttpRequest) -> Flow[None]:
        yield from Connect(self._proxy_host, self._proxy_port)
        yield from Write(self._connect_request(request))
        # Read byte-wise up to the end of the proxy's head so no tunnel bytes are consumed.
        head = bytearray()
        while not head.endswith(b"\r\n\r\n") and not head.endswith(b"\n\n"):
            byte = yield from Recv(1)
            if not byte:
                raise TransportError("the proxy closed the connection during CONNECT")
            head += byte
            if len(head) > request.max_header_bytes:
                raise TransportError("the proxy's CONNECT answer is too large")
        _check_connect_answer(bytes(head))


def _check_connect_answer(head: bytes) -> None:
    status_line = head.split(b"\n", 1)[0].strip().decode("latin-1", "replace")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit() or not parts[1].startswith("2"):
        raise TransportError(f"the proxy refused the tunnel: {status_line[:200]!r}")


# -- performing the steps: a blocking socket, or an anyio stream ------------------------------


class _Socket:
    """One exchange's blocking socket; every operation is bounded by the request's deadline."""

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self._sock: socket.socket | None = None
        self.perform: Perform = {
            Connect: self._connect,
            StartTLS: self._start_tls,
            Write: self._write,
            Recv: self._recv,
        }

    def _ready(self) -> socket.socket:
        if self._sock is None:
            raise TransportError("the connection is closed")
        self._sock.settimeout(self._request.remaining())
        return self._sock

    def _connect(self, step: Connect) -> None:
        self._sock = socket.create_connection(
            (step.host, step.port), timeout=self._request.remaining()
        )

    def _start_tls(self, step: StartTLS) -> None:
        self._sock = step.context.wrap_socket(self._ready(), server_hostname=step.server_hostname)

    def _write(self, step: Write) -> None:
        self._ready().sendall(step.data)

    def _recv(self, step: Recv) -> bytes:
        return self._ready().recv(step.size)

    def close(self) -> None:
        """Close the connection, if one was opened."""
        if self._sock is not None:
            self._sock.close()


class _Stream:
    """One exchange's anyio byte stream; every await is bounded by the request's deadline."""

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self._stream: anyio.abc.ByteStream | None = None
        self.perform: APerform = {
            Connect: self._connect,
            StartTLS: self._start_tls,
            Write: self._write,
            Recv: self._recv,
        }

    def _open(self) -> anyio.abc.ByteStream:
        if self._stream is None:
            raise TransportError("the connection is closed")
        return self._stream

    async def _connect(self, step: Connect) -> None:
        with time_limit(self._request.remaining()):
            self._stream = await _open_tcp(step.host, step.port)

    async def _start_tls(self, step: StartTLS) -> None:
        with time_limit(self._request.remaining()):
            # Not ``standard_compatible``: an exchange ends at the response's end or the
            # connection's, never at a TLS close_notify the server may not send.
            self._stream = await TLSStream.wrap(
                self._open(),
                hostname=step.server_hostname,
                ssl_context=step.context,
                standard_compatible=False,
            )

    async def _write(self, step: Write) -> None:
        try:
            with time_limit(self._request.remaining()):
                await self._open().send(step.data)
        except anyio.BrokenResourceError as error:
            raise _broken(error) from None

    async def _recv(self, step: Recv) -> bytes:
        try:
            with time_limit(self._request.remaining()):
                return await self._open().receive(step.size)
        except anyio.EndOfStream:
            return b""
        except anyio.BrokenResourceError as error:
            raise _broken(error) from None

    async def aclose(self) -> None:
        """Drop the connection at once, if one was opened, even while being cancelled.

        One exchange, then done: no polite TLS close, which would wait on the peer.
        """
        if self._stream is not None:
            with shielded():
                await anyio.aclose_forcefully(self._stream)


async def _open_tcp(host: str, port: int) -> anyio.abc.SocketStream:
    """A TCP connection to ``host``: an address straight, as the blocking socket connects.

    anyio's ``connect_tcp`` races every address it is given in a task group,
    which costs about a millisecond a connection for nothing here: the egress
    check has already chosen the one address. Only a name (an operator's proxy)
    goes through it, to be resolved.
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        try:
            return await anyio.connect_tcp(host, port)
        except OSError as error:
            # anyio words a refusal "All connection attempts failed", the socket's error its
            # cause; say it as the socket does.
            cause = error if error.errno is not None else error.__cause__
            if not isinstance(cause, OSError) or cause.errno is None:
                raise
            raise OSError(cause.errno, os.strerror(cause.errno)) from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        await _connect_socket(sock, host, port)
        return await anyio.abc.SocketStream.from_socket(sock)
    except BaseException:
        sock.close()
        raise


async def _connect_socket(sock: socket.socket, host: str, port: int) -> None:
    sock.setblocking(False)
    code = sock.connect_ex((host, port))
    if code == errno.EINPROGRESS:
        await anyio.wait_writable(sock)
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        raise OSError(code, os.strerror(code))


def _broken(error: anyio.BrokenResourceError) -> OSError:
    """The socket's own error under anyio's broken stream, as the blocking socket raises it."""
    cause = error.__cause__
    if isinstance(cause, OSError):
        return cause
    return ConnectionResetError("the connection broke")

"""The transport contract: one HTTP exchange with an address the policy already approved.

A transport never decides anything. It connects to ``request.address`` (not to
the host name, which it must not resolve), speaks to ``request.host`` in the
Host header and in TLS (server name and certificate check), sends one request
and hands back the status, headers and the raw body as it arrives, without
undoing any Content-Encoding: the `Fetcher` decompresses under its own limits.

Writing one takes a few lines; see ``docs/web.md``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Protocol, runtime_checkable

import attrs

from ..errors import TransportError

__all__ = [
    "AsyncHttpResponse",
    "AsyncTransport",
    "HttpRequest",
    "HttpResponse",
    "Transport",
    "TransportError",
]


@attrs.frozen(kw_only=True)
class HttpRequest:
    """One request to send: where to connect, what to say, and by when to be done."""

    method: str
    scheme: str  # "http" or "https"
    host: str  # the host name for Host and TLS (an IP address when the URL named one)
    address: str  # the approved IP address to connect to; never resolve ``host`` instead
    port: int
    target: str  # path and query for the request line
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    deadline: float  # time.monotonic() value by which the whole exchange must end
    max_header_bytes: int = 65536

    @property
    def url(self) -> str:
        """The URL this request is for, with the host name (not the address)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = {"http": 80, "https": 443}[self.scheme]
        authority = host if self.port == default else f"{host}:{self.port}"
        return f"{self.scheme}://{authority}{self.target}"

    def remaining(self) -> float:
        """Seconds left before the deadline; raises `TimeoutError` when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline for this exchange has passed")
        return left


def _no_close() -> None:
    return None


async def _no_aclose() -> None:
    return None


@attrs.frozen(kw_only=True)
class HttpResponse:
    """A response whose body is read by iterating ``chunks``; ``close`` ends the exchange early."""

    status: int
    reason: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    chunks: Iterator[bytes]
    close: Callable[[], None] = _no_close


@attrs.frozen(kw_only=True)
class AsyncHttpResponse:
    """The async twin of `HttpResponse`."""

    status: int
    reason: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    chunks: AsyncIterator[bytes]
    aclose: Callable[[], Awaitable[None]] = _no_aclose


@runtime_checkable
class Transport(Protocol):
    """Performs one HTTP exchange synchronously.

    ``send`` must connect to ``request.address`` and port, use ``request.host``
    for the Host header and TLS verification, stop by ``request.deadline``,
    and raise `OSError` (such as `TransportError` or `TimeoutError`) on failure.
    """

    def send(self, request: HttpRequest) -> HttpResponse:
        """Send the request and return once the response head has arrived."""
        ...


@runtime_checkable
class AsyncTransport(Protocol):
    """Performs one HTTP exchange in an event loop; the same rules as `Transport`."""

    async def asend(self, request: HttpRequest) -> AsyncHttpResponse:
        """Send the request and return once the response head has arrived."""
        ...

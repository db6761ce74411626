"""The steps of an HTTP exchange as a flow sees them, and how each driver performs them.

The `Fetcher` and the HTTP search providers write their logic once, as flows
over four steps: `Resolve` a name (in a worker the deadline can abandon,
since ``getaddrinfo`` cannot be interrupted), `Send` a request through the
transport, `Read` the next body chunk, `Close` the response. `ExchangeIO`
performs them in the calling thread, `AsyncExchangeIO` in an event loop (a
transport with only ``send`` runs there in worker threads). Nothing here
decides anything: which address, what to do on a failure, when to stop
reading, all stay in the flows.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Protocol

import attrs

from .._ground._aio import time_limit, to_thread
from ._content import BodyCollector
from ._egress import Resolver
from ._flow import APerform, Flow, Perform, Step, in_threads
from ._transport import AsyncHttpResponse, AsyncTransport, HttpRequest, HttpResponse, Transport

__all__ = [
    "AsyncExchangeIO",
    "Close",
    "ExchangeIO",
    "Head",
    "Read",
    "Resolve",
    "Send",
    "read_body",
]

_RESOLVER_THREADS = concurrent.futures.ThreadPoolExecutor(
    max_workers=4, thread_name_prefix="astralvessel-resolve"
)


class Head(Protocol):
    """What a flow sees of a response: both `HttpResponse` and `AsyncHttpResponse` are one."""

    @property
    def status(self) -> int: ...
    @property
    def reason(self) -> str: ...
    @property
    def headers(self) -> tuple[tuple[str, str], ...]: ...


@attrs.frozen
class Resolve(Step[Sequence[str]]):
    """Look ``host`` up once; a `TimeoutError` when ``deadline`` passes first."""

    host: str
    port: int
    deadline: float


@attrs.frozen
class Send(Step[Head]):
    """One exchange through the transport; the outcome is the response's head."""

    request: HttpRequest


@attrs.frozen
class Read(Step[bytes | None]):
    """The next raw body chunk of the response just sent; ``None`` at its end."""


@attrs.frozen
class Close(Step[None]):
    """End the response just sent (read fully or not)."""


def read_body(collector: BodyCollector, deadline: float) -> Flow[None]:
    """Read the body into ``collector`` until it ends, the collector is full, or the deadline."""
    while (chunk := (yield from Read())) is not None:
        collector.feed(chunk)
        if collector.truncated:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the deadline passed while reading the body")


class ExchangeIO:
    """Performs exchange steps in the calling thread, for `run`."""

    def __init__(self, transport: Transport, resolver: Resolver) -> None:
        self._transport = transport
        self._resolver = resolver
        self._response: HttpResponse | None = None
        self._chunks: Iterator[bytes] = iter(())
        self.perform: Perform = {
            Resolve: self._resolve,
            Send: self._send,
            Read: self._read,
            Close: self._close,
        }

    def _resolve(self, step: Resolve) -> Sequence[str]:
        future = _RESOLVER_THREADS.submit(self._resolver.resolve, step.host, step.port)
        try:
            return future.result(timeout=max(0.0, step.deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"resolving {step.host} took too long") from None

    def _send(self, step: Send) -> HttpResponse:
        self._response = self._transport.send(step.request)
        self._chunks = iter(self._response.chunks)
        return self._response

    def _read(self, step: Read) -> bytes | None:
        return next(self._chunks, None)

    def _close(self, step: Close) -> None:
        if self._response is not None:
            self._response.close()


class AsyncExchangeIO:
    """Performs exchange steps in an event loop, for `arun`."""

    def __init__(self, transport: Transport | AsyncTransport, resolver: Resolver) -> None:
        self._transport = transport
        self._resolver = resolver
        self._response: AsyncHttpResponse | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        if isinstance(transport, AsyncTransport):
            self.perform: APerform = {
                Resolve: self._resolve,
                Send: self._send,
                Read: self._read,
                Close: self._close,
            }
        elif isinstance(transport, Transport):
            # A sync-only transport: each blocking step in a worker, so the loop keeps running.
            self.perform = {
                **in_threads(ExchangeIO(transport, resolver).perform),
                Resolve: self._resolve,
            }
        else:
            raise TypeError(f"{type(transport).__name__} has neither send() nor asend()")

    async def _resolve(self, step: Resolve) -> Sequence[str]:
        try:
            with time_limit(step.deadline - time.monotonic()):
                # A lookup cannot be stopped; a late one finishes alone, its answer dropped.
                return await to_thread(self._resolver.resolve, step.host, step.port, abandon=True)
        except TimeoutError:
            raise TimeoutError(f"resolving {step.host} took too long") from None

    async def _send(self, step: Send) -> AsyncHttpResponse:
        assert isinstance(self._transport, AsyncTransport)  # noqa: S101 - chosen in __init__
        self._response = await self._transport.asend(step.request)
        self._chunks = aiter(self._response.chunks)
        return self._response

    async def _read(self, step: Read) -> bytes | None:
        return None if self._chunks is None else await anext(self._chunks, None)

    async def _close(self, step: Close) -> None:
        if self._response is not None:
            await self._response.aclose()

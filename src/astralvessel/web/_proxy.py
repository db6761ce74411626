"""The egress proxy: the host side of a turn's allow-listed network.

``EgressProxy.start`` listens on a unix socket in a fresh private folder;
the sandbox backends bind that folder into the sandbox, and the server's relay
(``sandbox/server/_relay.py``) splices each loopback connection a call opens
to it. For each connection the proxy reads one request head within its bounds,
lets ``_proxyhead`` decide it (allow-list, then webfetch's address rule on
one pinned DNS answer), connects to an approved address and copies bytes both
ways, counting them against the turn. Everything it refuses gets an HTTP
status and a reason the call can read, and nothing else.

The proxy runs its own asyncio loop on its own thread, whatever the host
runs (sync, asyncio or trio), and ``close`` ends every connection, the
listener and the thread: nothing outlives the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from .. import _otel
from .._leftovers import make_folder
from .._netallow import HostPattern, parse_allow_list
from .._unixsock import bind as bind_unix
from ._egress import EgressPolicy, Resolver, SystemResolver
from ._proxyhead import (
    ProxyLimits,
    ProxyRefusal,
    ProxyRequest,
    approve_addresses,
    read_request,
    refusal_bytes,
)

__all__ = ["EgressProxy", "ProxyCounters"]

_CHUNK = 65536
SOCKET_NAME = "proxy.sock"
#: Python 3.13 removes a unix listener's file at close, by the name it was bound at: here
#: maybe ``/proc/self/fd/N/...``, which names nothing once the bind is done. ``close``
#: removes the whole folder instead.
_NO_CLEANUP: dict[str, Any] = {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}


@attrs.define
class ProxyCounters:
    """What one turn's proxy has done so far (for the host's logs and tests)."""

    connections: int = 0
    refused: int = 0
    bytes: int = 0
    active: int = 0
    reasons: list[str] = attrs.Factory(list)


class EgressProxy:
    """One turn's egress proxy; build it with ``start`` and end it with ``close``."""

    def __init__(
        self,
        allow: Iterable[HostPattern | str],
        *,
        egress: EgressPolicy | None = None,
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
    ) -> None:
        self.allow = parse_allow_list(allow)
        self.egress = egress if egress is not None else EgressPolicy()
        self.resolver = resolver if resolver is not None else SystemResolver()
        self.limits = limits if limits is not None else ProxyLimits()
        self.counters = ProxyCounters()
        # Private to this host user; the socket itself is opened to the sandbox's
        # server (it may run as another uid, as in Docker), the folder only traversable.
        # Named compactly for this process (the socket's path is bounded), so a killed
        # host's folder is removed by the next host's first proxy (``_leftovers``).
        self.folder = Path(make_folder("egress", compact=True))
        self.folder.chmod(0o711)
        self.socket_path = self.folder / SOCKET_NAME
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="astralvessel-egress", daemon=True)
        #: The span each connection's span is a child of (the turn's; None: the current one).
        self.trace_parent: Any = None

    @classmethod
    def start(
        cls,
        allow: Iterable[HostPattern | str],
        *,
        egress: EgressPolicy | None = None,
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
    ) -> EgressProxy:
        """Start a proxy for ``allow`` and return it once its socket accepts connections."""
        proxy = cls(allow, egress=egress, resolver=resolver, limits=limits)
        proxy._thread.start()
        proxy._ready.wait()
        if proxy._failure is not None:
            proxy.close()
            raise proxy._failure
        return proxy

    def close(self) -> None:
        """End every connection and the listener, stop the thread, remove the folder."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread.ident is not None:
            self._thread.join(timeout=10.0)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> EgressProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop thread -----------------------------------------------------------------

    def _run(self) -> None:
        # Not asyncio.run: its end waits for the default executor, where a name lookup
        # that hangs (a DNS server that does not answer) would keep this thread alive
        # past close. Closing the loop leaves such a lookup to finish on its own.
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start(), which raises it
            self._failure = exc
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.ensure_future(self._traced(reader, writer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Through the folder's descriptor: a long TMPDIR leaves the path no room.
            bind_unix(listener, str(self.socket_path))
            server = await asyncio.start_unix_server(
                accept, sock=listener, limit=self.limits.head_bytes + 1, **_NO_CLEANUP
            )
        except BaseException:
            listener.close()
            raise
        # The server may run as another uid (Docker's 65534); the folder is 0711 and unlisted.
        os.chmod(self.socket_path, 0o666)  # noqa: S103 - see above
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counters = self.counters
        counters.active += 1
        try:
            # The head first, even when over budget: a refusal sent before the request is
            # read would reach the relay as a reset, and the call would lose the reason.
            request = await self._read_head(reader)
            refusal = self._over_budget()
            if refusal is not None:
                raise refusal
            counters.connections += 1
            upstream = await self._connect(request)
            await self._relay(request, reader, writer, upstream)
        except ProxyRefusal as refusal:
            counters.refused += 1
            counters.reasons.append(refusal.reason)
            with contextlib.suppress(OSError):
                writer.write(refusal_bytes(refusal.status, refusal.reason))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass  # the call or the origin went away, or went quiet too long
        finally:
            counters.active -= 1
            writer.close()

    async def _traced(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``_serve`` in a span (a child of the turn's, when the extra is installed)."""
        counters = self.counters
        refused = counters.refused
        span = _otel.start("astralvessel.proxy.connection", {}, self.trace_parent)
        try:
            await self._serve(reader, writer)
        finally:
            was_refused = counters.refused > refused
            reason = counters.reasons[-1] if was_refused and counters.reasons else None
            _otel.end(span, {"astralvessel.refused": was_refused, "astralvessel.reason": reason})

    def _over_budget(self) -> ProxyRefusal | None:
        limits, counters = self.limits, self.counters
        if counters.active > limits.concurrent:
            return ProxyRefusal(503, f"the turn already has {limits.concurrent} connections open")
        if counters.connections >= limits.connections:
            return ProxyRefusal(503, f"the turn has used all its {limits.connections} connections")
        if counters.bytes >= limits.total_bytes:
            return ProxyRefusal(503, f"the turn has moved all its {limits.total_bytes} bytes")
        return None

    async def _read_head(self, reader: asyncio.StreamReader) -> ProxyRequest:
        limits = self.limits
        try:
            head = await asyncio.wait_for(
                reader.readuntil(b"\r\n\r\n"), timeout=limits.head_seconds
            )
        except asyncio.TimeoutError:
            raise ProxyRefusal(
                408, f"the request head did not arrive within {limits.head_seconds:g} s"
            ) from None
        except asyncio.LimitOverrunError:
            raise ProxyRefusal(
                431, f"the request head is longer than {limits.head_bytes} bytes"
            ) from None
        return read_request(head, self.allow, limits)

    async def _connect(
        self, request: ProxyRequest
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        try:
            answers = await asyncio.wait_for(
                loop.run_in_executor(None, self.resolver.resolve, request.host, request.port),
                timeout=self.limits.connect_seconds,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise ProxyRefusal(502, f"{request.host} does not resolve ({exc})") from None
        # Pinned: the connection goes to an address approved here, never to a second lookup.
        addresses = approve_addresses(self.egress, request.host, request.port, answers)
        failures: list[str] = []
        for address in addresses:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, request.port, limit=_CHUNK),
                    timeout=self.limits.connect_seconds,
                )
            except (OSError, asyncio.TimeoutError) as exc:
                failures.append(f"{address}: {exc or 'timed out'}")
        raise ProxyRefusal(
            502, f"cannot connect to {request.host}:{request.port} ({'; '.join(failures)})"
        )

    async def _relay(
        self,
        request: ProxyRequest,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        up_reader, up_writer = upstream
        try:
            if request.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                self._charge(len(request.head))
                up_writer.write(request.head)
                await up_writer.drain()
            outbound = asyncio.ensure_future(self._pump(reader, up_writer))
            try:
                # The origin's side decides the end: once it is done, so is the exchange.
                await self._pump(up_reader, writer)
            finally:
                outbound.cancel()
                await asyncio.gather(outbound, return_exceptions=True)
        finally:
            up_writer.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        idle = self.limits.idle_seconds
        while True:
            data = await asyncio.wait_for(source.read(_CHUNK), timeout=idle)
            if not data:
                if sink.can_write_eof():
                    with contextlib.suppress(OSError):
                        sink.write_eof()
                return
            if not self._charge(len(data)):
                return
            sink.write(data)
            await sink.drain()

    def _charge(self, size: int) -> bool:
        """Count ``size`` bytes against the turn; False once the turn's budget is spent."""
        self.counters.bytes += size
        return self.counters.bytes <= self.limits.total_bytes

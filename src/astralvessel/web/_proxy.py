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
import contextvars
import os
import shutil
import socket
import struct
import sys
import threading
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

import attrs

from .._ground import _log, _otel
from .._ground._leftovers import make_folder
from .._ground._netallow import HostPattern, parse_allow_list
from .._ground._refusals import Refusals, Refused, Why, record
from .._ground._unixsock import bind as bind_unix
from ._egress import EgressPolicy, Resolver, SystemResolver
from ._proxyhead import (
    CHUNKED,
    TUNNEL_PEEK,
    ProxyLimits,
    ProxyRefusal,
    ProxyRequest,
    approve_addresses,
    chunk_size,
    read_request,
    refusal_bytes,
    tunnel_refusal,
)

__all__ = ["EgressProxy", "ProxyCounters"]

#: The reason the connection served in this task was refused, for its span (each connection
#: is its own task, so concurrent ones never read each other's).
_REFUSED: contextvars.ContextVar[str | None] = contextvars.ContextVar("refused", default=None)

_CHUNK = 65536
#: ``SO_PEERCRED``'s answer: pid, uid, gid.
_PEERCRED = struct.Struct("3i")
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
        # The refusals since the last drain: bounded (``_refusals``), written by the loop's
        # thread, drained by the turn's calls from theirs.
        self._refusals = Refusals()
        self._refusals_lock = threading.Lock()
        # Private to this host user, the folder only traversable; the socket inside is
        # given to the sandbox's uid once it is known (``admit``), and to no one else.
        # Named compactly for this process (the socket's path is bounded), so a killed
        # host's folder is removed by the next host's first proxy (``_leftovers``).
        self.folder = Path(make_folder("egress", compact=True))
        self.folder.chmod(0o711)
        self.socket_path = self.folder / SOCKET_NAME
        #: Who may connect besides this process's own uid: the turn's sandbox (``admit``);
        #: None (anyone) where the backend cannot say which uid that is.
        self._host_uid = os.geteuid()
        self._peer: int | None = self._host_uid
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
        self.drain()

    def admit(self, uid: int | None) -> None:
        """Let the sandbox's processes, host uid ``uid``, connect; no other user (but root).

        Called once the turn's sandbox has started (``SandboxSession.peer_uid``),
        and again with the next sandbox's when one dies. The socket becomes that
        uid's alone (mode 0600, which the kernel checks at connect), and each
        connection's peer is checked too (``SO_PEERCRED``). ``None`` (an engine
        that maps container uids itself) admits any local user, as before.
        """
        self._peer = uid
        mode = 0o600
        if uid is None:
            mode = 0o666  # the threat model says what remains
        elif uid != self._host_uid:
            try:
                os.chown(self.socket_path, uid, -1)
            except PermissionError:
                # A host that is not root (Docker's leased uid): the peer check alone holds.
                mode = 0o666
        os.chmod(self.socket_path, mode)

    def _admitted(self, conn: socket.socket) -> bool:
        """Whether the peer of ``conn`` is this host's user or the turn's sandbox."""
        peer = self._peer
        if peer is None:
            return True
        _, uid, _ = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if uid in (self._host_uid, peer):
            return True
        # Another local user's connection: not the turn's, so not one of its refusals.
        _log.event(_log.NETWORK, "proxy.turned_away", {"uid": uid}, _log.WARNING)
        return False

    def drain(self) -> Refusals:
        """The connections refused since the last drain (bounded), and forget them."""
        with self._refusals_lock:
            refusals, self._refusals = self._refusals, Refusals()
        return refusals

    def _refused(self, refusal: ProxyRefusal, request: ProxyRequest | None) -> None:
        """Count, keep (bounded) and log one refused connection."""
        host, port = refusal.host, refusal.port
        if not host and request is not None:
            host, port = request.host, request.port
        self.counters.refused += 1
        _REFUSED.set(refusal.reason)
        with self._refusals_lock:
            self._refusals = record(self._refusals, host, port, refusal.refused)
        _log.event(
            _log.NETWORK,
            "proxy.refused",
            {"host": host, "port": port, "status": refusal.status, "reason": refusal.reason},
        )

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
            if not self._admitted(writer.get_extra_info("socket")):
                writer.close()
                return
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
        # This user's alone until ``admit`` names the sandbox's uid; the folder is 0711.
        os.chmod(self.socket_path, 0o600)
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
        request: ProxyRequest | None = None
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
            # Recorded before the reply: once the call has read it, the turn can drain it.
            self._refused(refusal, request)
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
        _REFUSED.set(None)
        span = _otel.start("astralvessel.proxy.connection", {}, self.trace_parent)
        try:
            await self._serve(reader, writer)
        finally:
            reason = _REFUSED.get()
            _otel.end(
                span, {"astralvessel.refused": reason is not None, "astralvessel.reason": reason}
            )

    def _over_budget(self) -> ProxyRefusal | None:
        limits, counters = self.limits, self.counters
        if counters.active > limits.concurrent:
            return ProxyRefusal(503, Refused(why=Why.CONCURRENT, limit=limits.concurrent))
        if counters.connections >= limits.connections:
            return ProxyRefusal(503, Refused(why=Why.CONNECTIONS, limit=limits.connections))
        if counters.bytes >= limits.total_bytes:
            return ProxyRefusal(503, Refused(why=Why.TOTAL_BYTES, limit=limits.total_bytes))
        return None

    async def _read_head(self, reader: asyncio.StreamReader) -> ProxyRequest:
        limits = self.limits
        try:
            head = await asyncio.wait_for(
                reader.readuntil(b"\r\n\r\n"), timeout=limits.head_seconds
            )
        except asyncio.TimeoutError:
            refused = Refused(why=Why.HEAD_TIMEOUT, limit=limits.head_seconds)
            raise ProxyRefusal(408, refused) from None
        except asyncio.LimitOverrunError:
            refused = Refused(why=Why.HEAD_TOO_LONG, limit=limits.head_bytes)
            raise ProxyRefusal(431, refused) from None
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
            refused = Refused(why=Why.NO_RESOLVE, host=request.host, given=str(exc))
            raise ProxyRefusal(502, refused, host=request.host, port=request.port) from None
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
        refused = Refused(
            why=Why.CANNOT_CONNECT, host=request.host, port=request.port, given="; ".join(failures)
        )
        raise ProxyRefusal(502, refused, host=request.host, port=request.port)

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
                first = await self._within(reader.readexactly(TUNNEL_PEEK))
                refusal = tunnel_refusal(first, request.host, request.port)
                if refusal is not None:
                    raise refusal
                await self._forward(up_writer, first)
                sending = self._pump(reader, up_writer)
            else:
                await self._forward(up_writer, request.head)
                sending = self._send_body(request, reader, up_writer)
            outbound = asyncio.ensure_future(sending)
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

    async def _send_body(
        self, request: ProxyRequest, source: asyncio.StreamReader, sink: asyncio.StreamWriter
    ) -> None:
        """Pass on exactly the request's body, then nothing more from the call.

        What follows the body on the connection (a pipelined request, or one
        smuggled after a chunked body) never reaches the origin: the proxy
        stops reading, and the origin's answer to this one request ends the
        exchange. A body framed wrong closes the origin's side.
        """
        try:
            if request.body == CHUNKED:
                await self._send_chunks(source, sink)
            else:
                await self._copy(source, sink, request.body)
        except ProxyRefusal as refusal:
            self._refused(refusal, request)
            sink.close()
        except asyncio.LimitOverrunError:
            self._refused(ProxyRefusal(400, Refused(why=Why.CHUNK_LINE_LONG)), request)
            sink.close()

    async def _send_chunks(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while True:
            line = await self._within(source.readuntil(b"\r\n"))
            size = chunk_size(line)
            await self._forward(sink, line)
            if size == 0:
                break
            await self._copy(source, sink, size)
            end = await self._within(source.readexactly(2))
            if end != b"\r\n":
                # The origin would read the chunk's end elsewhere than the proxy did.
                raise ProxyRefusal(400, Refused(why=Why.CHUNK_END))
            await self._forward(sink, end)
        fields = self.limits.head_fields
        for _ in range(fields + 1):  # the trailer's fields, then the blank line
            line = await self._within(source.readuntil(b"\r\n"))
            await self._forward(sink, line)
            if line == b"\r\n":
                return
        raise ProxyRefusal(431, Refused(why=Why.TRAILER_FIELDS, limit=fields))

    async def _copy(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, size: int
    ) -> None:
        """Pass on ``size`` bytes of the call's (fewer if it stops sending)."""
        while size > 0:
            data = await self._within(source.read(min(size, _CHUNK)))
            if not data:
                return
            size -= len(data)
            await self._forward(sink, data)

    async def _forward(self, sink: asyncio.StreamWriter, data: bytes) -> None:
        """Write ``data`` on, counted against the turn; ``OSError`` once the budget is spent."""
        if not self._charge(len(data)):
            raise ConnectionAbortedError("the turn's byte budget is spent")
        sink.write(data)
        await sink.drain()

    async def _within(self, step: Awaitable[bytes]) -> bytes:
        """One read from the call, bounded by the idle time."""
        return await asyncio.wait_for(step, timeout=self.limits.idle_seconds)

    def _charge(self, size: int) -> bool:
        """Count ``size`` bytes against the turn; False once the turn's budget is spent."""
        self.counters.bytes += size
        return self.counters.bytes <= self.limits.total_bytes

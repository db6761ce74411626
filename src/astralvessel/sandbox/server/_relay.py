"""The egress relay: a loopback TCP listener that splices each connection to the host's proxy.

A turn whose policy allows a network keeps its own network namespace with
only loopback. The host runs the egress proxy outside the sandbox, on a unix
socket bound into it; calls cannot open unix sockets (the call filter refuses
them), so the server forks this relay at hello. It listens on
``127.0.0.1:PORT`` (what the calls' ``HTTP_PROXY`` names) and, for each
connection a call opens, connects to the proxy's socket and copies bytes both
ways, reading nothing: every decision is the host proxy's.

One process, one ``selectors`` loop, non-blocking sockets, a bounded buffer
per direction (a side that stops reading stops the other side's reads), and at
most ``MAX_CONNECTIONS`` at once. It dies with the server (``PDEATHSIG``) and
with the sandbox. Stdlib only, Python 3.8+.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import traceback

from . import _launch

__all__ = ["start"]

#: Connections the relay holds at once; the host proxy bounds the turn's total itself.
MAX_CONNECTIONS = 64
_CHUNK = 65536


class _Side:
    """One socket of a spliced pair and the bytes waiting to be written to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""
        self.read_done = False  # its peer sent end-of-file
        self.peer: _Side | None = None


class _Relay:
    def __init__(self, listener: socket.socket, target: str) -> None:
        self.listener = listener
        self.target = target
        self.selector = selectors.DefaultSelector()
        self.sides: dict[int, _Side] = {}

    def serve(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        while True:
            for key, events in self.selector.select():
                if key.data is None:
                    self._accept()
                else:
                    self._service(key.data, events)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        if len(self.sides) >= 2 * MAX_CONNECTIONS:
            client.close()
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.target)
        except OSError:
            upstream.close()
            client.close()
            return
        a, b = _Side(client), _Side(upstream)
        a.peer, b.peer = b, a
        for side in (a, b):
            side.sock.setblocking(False)
            self.sides[side.sock.fileno()] = side
        self._update(a)
        self._update(b)

    def _events(self, side: _Side) -> int:
        events = 0
        peer = side.peer
        # Read only while the peer's buffer has room: backpressure instead of memory.
        if not side.read_done and peer is not None and len(peer.pending) < _CHUNK:
            events |= selectors.EVENT_READ
        if side.pending:
            events |= selectors.EVENT_WRITE
        return events

    def _update(self, side: _Side) -> None:
        events = self._events(side)
        registered = side.sock.fileno() in self.selector.get_map()
        if events and registered:
            self.selector.modify(side.sock, events, side)
        elif events:
            self.selector.register(side.sock, events, side)
        elif registered:
            self.selector.unregister(side.sock)

    def _service(self, side: _Side, events: int) -> None:
        peer = side.peer
        if peer is None:
            return
        try:
            if events & selectors.EVENT_WRITE and side.pending:
                sent = side.sock.send(side.pending)
                side.pending = side.pending[sent:]
                if not side.pending and peer.read_done:
                    side.sock.shutdown(socket.SHUT_WR)
            if events & selectors.EVENT_READ:
                data = side.sock.recv(_CHUNK)
                if data:
                    peer.pending += data
                else:
                    side.read_done = True
                    if not peer.pending:
                        peer.sock.shutdown(socket.SHUT_WR)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(side)
            return
        if side.read_done and peer.read_done and not side.pending and not peer.pending:
            self._close(side)
            return
        self._update(side)
        self._update(peer)

    def _close(self, side: _Side) -> None:
        for one in (side, side.peer):
            if one is None:
                continue
            self.sides.pop(one.sock.fileno(), None)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(one.sock)
            one.sock.close()
            one.peer = None


def start(target: str, port: int, drop_uid: int | None, drop_gid: int | None) -> int:
    """Listen on ``127.0.0.1:port``, fork the relay to ``target`` (a unix socket path); its pid.

    The listener is bound here, before ``ready``, so no call can take the port
    first; raises ``OSError`` if it cannot be. The relay gives up the server's
    identity (as the file worker does) before it serves.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            keep = {listener.fileno(), 2}
            _launch.close_fds_except(keep)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _launch.prctl(_launch.PR_SET_PDEATHSIG, 9)
            if os.getppid() == server:
                _launch._drop(drop_uid, drop_gid)
                _launch.prctl(_launch.PR_SET_NO_NEW_PRIVS, 1)
                _Relay(listener, target).serve()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(0)
    listener.close()
    return pid

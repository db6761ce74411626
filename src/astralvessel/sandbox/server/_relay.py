"""The egress relay: a loopback TCP listener that splices each connection to the host's proxy.

A turn whose policy allows a network keeps its own network namespace with
only loopback. The host runs the egress proxy outside the sandbox, on a unix
socket bound into it; calls cannot open unix sockets (the call filter refuses
them), so the server forks this relay at hello. It listens on
``127.0.0.1:PORT`` (what the calls' ``HTTP_PROXY`` names) and, for each
connection a call opens, connects to the proxy's socket and copies bytes both
ways, reading nothing: every decision is the host proxy's.

One process, one selector loop, non-blocking sockets, a bounded buffer
per direction (a side that stops reading stops the other side's reads), and at
most ``MAX_CONNECTIONS`` at once. It dies with the server (``PDEATHSIG``) and
with the sandbox. Stdlib only, Python 3.8+.
"""

from __future__ import annotations

import _socket  # socket's C type: the socket module would import enum (see _lean)
import os
import sys

from . import _launch, _sys
from ._lean import EVENT_READ, EVENT_WRITE, Selector, signal, suppress

# The relay process alone imports socket, for its listener's accept (see start).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

__all__ = ["start"]

#: Connections the relay holds at once; the host proxy bounds the turn's total itself.
MAX_CONNECTIONS = 64
_CHUNK = 65536


class _Side:
    """One socket of a spliced pair and the bytes waiting to be written to it."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.pending = b""
        self.read_done = False  # it sent end-of-file (or failed): nothing more to read
        self.broken = False  # writing to it failed: what its peer sends is dropped
        self.shut = False  # its write side is shut down, after its peer's end-of-file
        self.peer: _Side | None = None


class _Relay:
    def __init__(self, listener: socket.socket, target: str) -> None:
        self.listener = listener
        self.target = target
        self.selector = Selector()
        self.pairs = 0

    def serve(self) -> None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, EVENT_READ, None)
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
        if self.pairs >= MAX_CONNECTIONS:
            client.close()
            return
        upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            upstream.connect(self.target)
        except OSError:
            upstream.close()
            client.close()
            return
        self.pairs += 1
        a, b = _Side(client), _Side(upstream)
        a.peer, b.peer = b, a
        for side in (a, b):
            side.sock.setblocking(False)
            self._update(side)

    def _update(self, side: _Side) -> None:
        peer = side.peer
        events = 0
        # Read only while the peer's buffer has room: backpressure instead of memory.
        if not side.read_done and peer is not None and len(peer.pending) < _CHUNK:
            events |= EVENT_READ
        if side.pending:
            events |= EVENT_WRITE
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
        if events & EVENT_WRITE and side.pending:
            try:
                sent = side.sock.send(side.pending)
                side.pending = side.pending[sent:]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                # It cannot take more: stop reading what was meant for it, keep the other way.
                side.pending, side.broken, peer.read_done = b"", True, True
        if events & EVENT_READ and not side.read_done:
            try:
                data: bytes | None = side.sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                side.read_done = True
            elif data and not peer.broken:
                peer.pending += data
        for one in (side, peer):
            source = one.peer
            if source is not None and source.read_done and not one.pending and not one.shut:
                # Pass the end of the stream on once everything before it is delivered.
                one.shut = True
                with suppress(OSError):
                    one.sock.shutdown(_socket.SHUT_WR)
        if side.read_done and peer.read_done and not side.pending and not peer.pending:
            self._close(side, peer)
            return
        self._update(side)
        self._update(peer)

    def _close(self, *sides: _Side) -> None:
        self.pairs -= 1
        for one in sides:
            with suppress(KeyError, ValueError):
                self.selector.unregister(one.sock)
            one.sock.close()
            one.peer = None


def start(
    target: str,
    port: int,
    drop_uid: int | None,
    drop_gid: int | None,
    *,
    own_userns: bool = False,
    confine: bool = True,
    seccomp: bytes | None = None,
    install_seccomp: Callable[[bytes], None] | None = None,
) -> int:
    """Listen on ``127.0.0.1:port``, fork the relay to ``target`` (a unix socket path); its pid.

    The listener is bound here, before ``ready``, so no call can take the port
    first; raises ``OSError`` if it cannot be. The relay gives up the server's
    identity as the file worker does (``own_userns``, ``confine``: see
    ``_launch.become_call_user``) and stacks ``seccomp``, its own filter (unix sockets
    alone, no process: ``_seccomp.RELAY`` on the host), over the server's before it serves.
    """
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
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
            _launch.die_with_parent(lambda: os.getppid() != server)
            # Here, before the drop (the library may be unreadable after it), and in the
            # relay only: the server would hold socket's imports in every idle turn.
            import socket

            accepting = socket.socket(fileno=listener.detach())
            _launch.become_call_user(drop_uid, drop_gid, own_userns=own_userns, confine=confine)
            # The drop cleared the parent-death signal: armed again, or the relay, which
            # only waits for connections, would outlive a server killed on the host.
            _launch.die_with_parent(lambda: os.getppid() != server)
            _sys.prctl(_sys.PR_SET_NO_NEW_PRIVS, 1)
            _launch.stack_filter(seccomp, install_seccomp)
            _Relay(accepting, target).serve()
        except BaseException:
            # The interpreter's own hook prints the traceback without importing traceback
            # (and re, through it) into every server's start-up, and after the drop above.
            sys.excepthook(*sys.exc_info())
        finally:
            os._exit(0)
    listener.close()
    return pid

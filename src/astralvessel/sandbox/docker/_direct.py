"""A turn's direct channel to its server: a unix socket, not the engine's attach stream.

On the attach stream every frame passes through dockerd and containerd-shim, each
woken for it, both ways (a small echo takes about 76 µs there and 15 µs over a
socket), and at each start the server's code crosses it too. With a local engine
the host listens on a socket in a folder of its own, bound into the container at
``CHANNEL_DIR``; the server connects to it first thing (``_boot_connect``)
and speaks the protocol over it. The attach stream stays, for the server's stderr
and the container's removal. The socket is the lifeline as the stdin was: a host
that dies closes its end, and the server reads the end of its input.

The socket carries descriptors too (``SCM_RIGHTS``), where a pipe could not: an
ordinary user's host, which may not ``pidfd_getfd`` a container's process (another
uid's, and Docker's seccomp profile refuses it), takes a frozen workspace's held
mount with the freeze's answer (``_frozen``), and passes a frozen layer to a fork's
server with its hello (``Policy.workspace_lower_fd``), or a warm sandbox's adoption
socket (``_adoption``).

Only the turn's own uid may connect (``SO_PEERCRED``): the folder must be
reachable by that uid inside the container, so another host user could reach it
too, and would be turned away. The folder is removed once the server is in; a
host killed before that leaves it behind, named for its process, and the next
host process to open a channel removes it (``reap_leftovers``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import socket
import struct
import tempfile
import threading
import time
from collections import deque

from ..._ground._leftovers import leftover_folders, owned_prefix
from ..._ground._unixsock import bind as bind_unix
from ...errors import SandboxError
from ._attach import AttachChannel
from ._engine import process_start_time
from ._spec import CHANNEL_SOCKET
from ._starting import Starting

__all__ = ["DirectChannel", "Listener", "NotConnectedError", "reap_leftovers"]

_PEERCRED = struct.Struct("3i")
#: What the connect bootstrap says when it cannot reach the host's socket.
_REFUSED = "astralvessel: cannot reach the host"
#: How long ``describe_exit`` and ``close`` wait for the engine to see a dead server's
#: container end.
_EXIT_WAIT = 5.0


#: The most descriptors one read takes from the server (a freeze's answer passes one);
#: any more are closed by the kernel, and any taken but not asked for, at ``close``.
_MAX_PASSED = 4
_PASSED_SPACE = socket.CMSG_SPACE(_MAX_PASSED * 4)


def _passed(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors an ``SCM_RIGHTS`` message brought."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", data[:usable]))
    return fds


#: The kind of this module's folders: ``astralvessel-channel-<pid>-<start time>-...``.
_KIND = "channel"


def reap_leftovers(parent: str | None = None) -> int:
    """Remove the channel folders of dead host processes in ``parent``; return how many.

    A host killed between making its folder and its server connecting leaves
    the folder (empty but for the socket). Only real folders of this uid go,
    and only their socket with them: never a link, never anything else's.
    """
    removed = 0
    for entry in leftover_folders(_KIND, parent, process_start_time):
        with contextlib.suppress(OSError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(entry.path, CHANNEL_SOCKET))
            os.rmdir(entry.path)
            removed += 1
    return removed


@functools.cache
def _reap_once() -> None:
    """Reap at this process's first channel only; the folders of the dead do not come back.

    (Two first channels at once may both reap: a folder is removed once, harmlessly.)
    """
    reap_leftovers()


class NotConnectedError(SandboxError):
    """The server could not connect to the host's socket (a host whose policy forbids it)."""


class Listener:
    """The host's end before the server connects: a folder with one listening socket."""

    def __init__(self, uid: int) -> None:
        self._uid = uid
        _reap_once()
        # Named for this process, so that what a killed host leaves is found (``reap_leftovers``).
        self.folder = tempfile.mkdtemp(prefix=owned_prefix(_KIND))
        self._path = os.path.join(self.folder, CHANNEL_SOCKET)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Reachable by the turn's uid in the container, listable by no one else; anyone
            # else who connects is turned away by ``accept``.
            os.chmod(self.folder, 0o711)  # noqa: S103 - the peer is checked, see accept
            # Through the folder's descriptor: a long TMPDIR leaves the path no room.
            bind_unix(self._sock, self._path)
            os.chmod(self._path, 0o666)  # noqa: S103 - the peer is checked, see accept
            self._sock.listen(8)
        except BaseException:
            self.close()
            raise

    def accept(
        self, attach: AttachChannel, timeout: float, starting: Starting | None = None
    ) -> socket.socket:
        """The server's connection; ``SandboxError`` if its container ends first or time runs out.

        Connections from any other uid are closed and the wait goes on. With
        ``starting`` (the engine still starting the container), its refusal is
        raised as soon as it comes (``Starting.result``), and ``timeout`` runs
        from its answer: a start queued behind others (``_gate``) is not the
        server's delay, and the engine's request has a timeout of its own.
        """
        deadline = None if starting is not None else time.monotonic() + timeout
        # poll, not select: a host with hundreds of turns holds descriptors past 1024.
        waiting = select.poll()
        waiting.register(self._sock.fileno(), select.POLLIN)
        waiting.register(attach.fileno(), select.POLLIN)
        if starting is not None:
            waiting.register(starting.fileno(), select.POLLIN)
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise SandboxError(
                    f"the docker sandbox server did not connect within {timeout:g} s; "
                    f"{attach.describe_exit()}"
                )
            readable = {
                fd for fd, _ in waiting.poll(None if remaining is None else remaining * 1000)
            }
            if starting is not None and starting.fileno() in readable:
                waiting.unregister(starting.fileno())
                starting.result()
                starting = None
                deadline = time.monotonic() + timeout
            if attach.fileno() in readable and not attach.pump():
                if starting is not None:
                    # A container the runtime could not start ends before the engine
                    # answers: its refusal says more than the exit does.
                    starting.result()
                described = attach.describe_exit()
                error = NotConnectedError if _REFUSED in described else SandboxError
                raise error(f"the turn's container ended before its server connected; {described}")
            if self._sock.fileno() in readable:
                conn, _ = self._sock.accept()
                _, uid, _ = _PEERCRED.unpack(
                    conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
                )
                if uid == self._uid:
                    conn.setblocking(True)
                    return conn
                conn.close()

    def close(self) -> None:
        """Stop listening and remove the folder (a container keeps its bound view). Never raises."""
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self._path)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


class DirectChannel:
    """A ``Channel`` over the server's socket; the attach stream under it keeps stderr."""

    def __init__(
        self, sock: socket.socket, attach: AttachChannel, starting: Starting | None = None
    ) -> None:
        self._sock = sock
        self._attach = attach
        #: The engine's answer to the container's start, maybe still on its way (``settle``).
        self._starting = starting
        #: The turn's container.
        self.container_id = attach.container_id
        self._ours = sock.fileno()
        self._theirs = attach.fileno()
        # Used by the one reading thread only; poll, as a host may hold over 1024 descriptors.
        self._waiting = select.poll()
        self._waiting.register(self._ours, select.POLLIN)
        self._waiting.register(self._theirs, select.POLLIN)
        self._watching = True
        #: Whether the socket has ended (the server is gone).
        self._ended = False
        self._closed = False
        self._lock = threading.Lock()
        #: Descriptors the server passed (``SCM_RIGHTS``), oldest first (``take_passed``).
        self._passed: deque[int] = deque()

    def settle(self) -> None:
        """Wait for the engine's answer to the container's start; raise its refusal.

        The server connects before the engine answers the start, and boots
        meanwhile: the turn is started once both are done (``ServerLink.settle``).
        """
        if self._starting is not None:
            self._starting.settle()

    def host_pid(self) -> int:
        """The engine's host pid of the server (``AttachChannel.host_pid``)."""
        return self._attach.host_pid()

    def widen_memory(self, extra: int) -> None:
        """Raise the container's memory bound (``AttachChannel.widen_memory``)."""
        self._attach.widen_memory(extra)

    def send(self, data: bytes) -> None:
        """Write to the server."""
        self._sock.sendall(data)

    def send_fds(self, data: bytes, fds: tuple[int, ...]) -> None:
        """Write ``data`` to the server, ``fds`` passed with its first byte (``SCM_RIGHTS``).

        The server takes them with the frame that starts there (a hello's frozen layer)."""
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        sent = self._sock.sendmsg([data], ancillary)
        if sent < len(data):
            self._sock.sendall(data[sent:])

    def take_passed(self) -> int | None:
        """The oldest descriptor the server passed and nobody took yet (the caller's to
        close), or None. A reply that names one comes after it: by the time the caller
        has the reply, the descriptor is here."""
        try:
            return self._passed.popleft()
        except IndexError:
            return None

    def recv(self, size: int) -> bytes:
        """Return up to ``size`` bytes from the server; ``b""`` only at end of stream.

        While waiting, what the server writes to stderr is taken into the attach
        channel's tail, so its stderr never fills and blocks it.
        """
        try:
            while self._watching and not self._closed:
                readable = {fd for fd, _ in self._waiting.poll()}
                if self._theirs in readable and not self._attach.pump():
                    self._watching = False
                if self._ours in readable:
                    break
            data, ancillary, _, _ = self._sock.recvmsg(size, _PASSED_SPACE, socket.MSG_CMSG_CLOEXEC)
            if ancillary:
                fds = _passed(ancillary)
                if self._closed:
                    for fd in fds:
                        os.close(fd)
                else:
                    self._passed.extend(fds)
        except (OSError, ValueError):
            if self._closed:
                return b""
            raise
        if not data:
            self._ended = True
        return data

    def _await_exit(self, seconds: float) -> None:
        """Wait (``seconds`` at most) for the attach stream's end, taking what it brings.

        The socket ends as the server dies, before the engine has seen the
        container exit; the attach stream ends after, the server's last words
        (a traceback) before its end.
        """
        deadline = time.monotonic() + seconds
        with contextlib.suppress(OSError, ValueError):
            waiting = select.poll()
            waiting.register(self._theirs, select.POLLIN)
            while self._watching and (remaining := deadline - time.monotonic()) > 0:
                if waiting.poll(remaining * 1000) and not self._attach.pump():
                    self._watching = False

    def close(self) -> None:
        """Close the socket, then remove the container (``AttachChannel.close``). Never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        while (fd := self.take_passed()) is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._starting is not None:
            # No start request left running behind a removed container.
            with contextlib.suppress(Exception):
                self._starting.result()
        if self._ended:
            # The server has gone (a shutdown): remove its container once the engine has
            # seen it end, which costs less than removing one still going down.
            self._await_exit(_EXIT_WAIT)
        self._attach.close()

    def describe_exit(self) -> str:
        """Why the sandbox ended: the container's state and the server's stderr tail."""
        if not self._closed:
            # So that the state read is the container's exit, and the tail holds its end.
            self._await_exit(_EXIT_WAIT)
        return self._attach.describe_exit()

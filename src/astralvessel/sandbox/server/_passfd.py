"""Descriptors over the host's socket (``SCM_RIGHTS``): Docker's direct channel (stdlib, 3.8+).

A Docker turn's server speaks to the host over a unix socket (``docker/_direct``),
where the namespace backends' speak over pipes. An ordinary user's host cannot take
a descriptor from the container's process (``pidfd_getfd``: another uid, and Docker's
seccomp profile refuses it), so there the server passes what the host must hold with
the frame that names it: the frozen workspace's held mount with a freeze's answer
(``Freeze.passed``). The host passes a frozen layer with a fork's hello the same way
(``Hello.workspace_lower_fd``). Elsewhere there is no socket, and nothing is passed.
"""

from __future__ import annotations

import _socket
import os
import select
import stat
import struct

from ._messages import MAX_LAYERS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["host_socket", "receive", "send"]

#: The most descriptors one read of the host's channel takes unless told (a hello passes
#: one layer, or a stack's ``MAX_LAYERS``, with no adoption socket); the kernel closes
#: the rest.
_MAX = MAX_LAYERS


def host_socket(fd: int) -> Any:
    """A socket object over a copy of ``fd`` where it is a unix socket (else None)."""
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        return None
    return _socket.socket(fileno=os.dup(fd))


def receive(sock: Any, size: int, most: int = _MAX) -> tuple[bytes, list[int]]:
    """Up to ``size`` bytes from the host and the descriptors passed with them (close-on-exec):
    room for ``most`` of them at least (the kernel closes any past the room).

    Raises ``BlockingIOError`` where nothing waits (the socket is non-blocking)."""
    space = _socket.CMSG_SPACE(most * 4)
    data, ancillary, _, _ = sock.recvmsg(size, space, _socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, raw in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(raw) - len(raw) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", raw[:usable]))
    return data, fds


def send(sock: Any, data: bytes, fd: int) -> int:
    """Send the first of ``data`` with ``fd`` passed; return how many bytes went (the caller
    writes the rest). Waits for room, as a blocking write would."""
    ancillary = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("i", fd))]
    while True:
        try:
            return int(sock.sendmsg([data], ancillary))
        except BlockingIOError:
            waiting = select.poll()
            waiting.register(sock.fileno(), select.POLLOUT)
            waiting.poll()

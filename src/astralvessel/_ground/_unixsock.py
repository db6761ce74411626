"""Unix sockets at paths of any length: reached through their folder's descriptor.

The kernel bounds a unix socket's address to 107 bytes (``sun_path``, its NUL
included makes 108), and a host's temporary folder may be longer by itself
(pytest's ``tmp_path``, a CI runner's workspace, a deep ``TMPDIR``). A socket
whose path does not fit is bound or reached as ``/proc/self/fd/N/<name>``
instead, ``N`` a descriptor of its folder: the kernel follows that link to the
folder itself, so the socket lands at its real path, under the folder's own
permissions, and the address stays short whatever the path. (Abstract sockets
are short too, but any process of the network namespace could reach them, and
the host's namespace is shared.)

A path that cannot be shortened so (no ``/proc``, or a name too long by
itself) raises ``BackendUnavailableError`` naming the path and the fix, never
the socket module's bare ``OSError``.
"""

from __future__ import annotations

import contextlib
import os
import socket

from ..errors import BackendUnavailableError

__all__ = ["MAX_ADDRESS_BYTES", "ShortAddress", "bind"]

#: The longest path a unix socket's address holds (``sun_path`` less its NUL).
MAX_ADDRESS_BYTES = 107
#: What to do about a socket in the temporary folder whose path cannot be shortened.
_SHORTER_TMPDIR = "set TMPDIR to a shorter folder (such as /tmp)"


class ShortAddress:
    """An address for the unix socket at ``path`` that the kernel takes, valid until ``close``:
    the path itself where it fits, else ``/proc/self/fd/N/<name>`` through a descriptor of
    its folder, held open meanwhile.

    Raises ``BackendUnavailableError`` naming the path and ``fix`` if the path
    is too long and cannot be shortened, and ``OSError`` if its folder cannot
    be opened.
    """

    def __init__(self, path: str, *, fix: str = _SHORTER_TMPDIR) -> None:
        self.path = path
        self.address = path
        self._fd: int | None = None
        if len(os.fsencode(path)) <= MAX_ADDRESS_BYTES:
            return
        folder, name = os.path.split(path)
        # O_PATH: the folder need only be searchable, as for the path itself.
        fd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        address = f"/proc/self/fd/{fd}/{name}"
        problem = None
        if len(os.fsencode(address)) > MAX_ADDRESS_BYTES:
            problem = "so is its name alone"
        elif not os.path.isdir(os.path.dirname(address)):
            problem = "/proc is not mounted to shorten it"
        if problem is not None:
            os.close(fd)
            size = len(os.fsencode(path))
            raise BackendUnavailableError(
                f"cannot use the unix socket {path}: its path is {size} bytes, over the "
                f"{MAX_ADDRESS_BYTES} a socket's address holds, and {problem}; {fix}"
            )
        self._fd = fd
        self.address = address

    def close(self) -> None:
        """Close the folder's descriptor, if one was opened (the address then names nothing)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def bind(sock: socket.socket, path: str) -> None:
    """Bind the unix socket ``sock`` at ``path``, whatever its length.

    Raises ``BackendUnavailableError`` for a path that cannot be shortened
    (see ``ShortAddress``), else ``OSError`` as ``socket.bind`` does.
    """
    with contextlib.closing(ShortAddress(path)) as short:
        sock.bind(short.address)

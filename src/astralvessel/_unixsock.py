"""Unix sockets at paths of any length: bound through their folder's descriptor.

The kernel bounds a unix socket's address to 107 bytes (``sun_path``, its NUL
included makes 108), and a host's temporary folder may be longer by itself
(pytest's ``tmp_path``, a CI runner's workspace, a deep ``TMPDIR``). A socket
whose path does not fit is bound as ``/proc/self/fd/N/<name>``
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
from collections.abc import Iterator

from .errors import BackendUnavailableError

__all__ = ["MAX_ADDRESS_BYTES", "bind"]

#: The longest path a unix socket's address holds (``sun_path`` less its NUL).
MAX_ADDRESS_BYTES = 107


def _too_long(path: str, why: str) -> BackendUnavailableError:
    size = len(os.fsencode(path))
    return BackendUnavailableError(
        f"cannot use the unix socket {path}: its path is {size} bytes, over the "
        f"{MAX_ADDRESS_BYTES} a socket's address holds, and {why}; set TMPDIR to a "
        "shorter folder (such as /tmp)"
    )


@contextlib.contextmanager
def _address(path: str) -> Iterator[str]:
    """An address for ``path`` no longer than the kernel takes, valid within the block.

    Raises ``BackendUnavailableError`` if ``path`` is too long and cannot be
    shortened, and ``OSError`` if its folder cannot be opened.
    """
    if len(os.fsencode(path)) <= MAX_ADDRESS_BYTES:
        yield path
        return
    folder, name = os.path.split(path)
    # O_PATH: the folder need only be searchable, as for the path itself.
    fd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        address = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(address)) > MAX_ADDRESS_BYTES:
            raise _too_long(path, "so is its name alone")
        if not os.path.isdir(os.path.dirname(address)):
            raise _too_long(path, "/proc is not mounted to shorten it")
        yield address
    finally:
        os.close(fd)


def bind(sock: socket.socket, path: str) -> None:
    """Bind the unix socket ``sock`` at ``path``, whatever its length.

    Raises ``BackendUnavailableError`` for a path that cannot be shortened
    (see the module's docstring), else ``OSError`` as ``socket.bind`` does.
    """
    with _address(path) as address:
        sock.bind(address)

"""An engine's unix socket at a path too long for a socket's address (107 bytes).

The engine's socket is where ``DOCKER_HOST``, the CLI's context or Podman's
``XDG_RUNTIME_DIR`` put it, and the SDK connects to it by its path for each
connection of its pool. A path over the bound is given to the SDK as
``/proc/self/fd/N/<name>`` (``_unixsock``), ``N`` a descriptor of its folder
that ``EngineAddresses`` holds open until the engine's client is closed.
"""

from __future__ import annotations

import threading

from ..._ground._unixsock import ShortAddress

__all__ = ["EngineAddresses"]

_UNIX_PREFIXES = ("unix://", "http+unix://")
_FIX = "point DOCKER_HOST at a shorter path (a link to the socket will do)"


class EngineAddresses:
    """The short addresses of one engine client's sockets, held until ``close``."""

    def __init__(self) -> None:
        self._held: list[ShortAddress] = []
        self._lock = threading.Lock()

    def url(self, url: str) -> str:
        """``url`` with a unix socket's path shortened if it is too long; others unchanged.

        Raises ``BackendUnavailableError`` naming the path and the fix if it
        cannot be shortened, and ``OSError`` if its folder cannot be opened.
        """
        for prefix in _UNIX_PREFIXES:
            if url.startswith(prefix):
                short = ShortAddress(url[len(prefix) :], fix=_FIX)
                with self._lock:
                    self._held.append(short)
                return prefix + short.address
        return url

    def close(self) -> None:
        """Close every folder descriptor held; the client must not open connections after."""
        with self._lock:
            held, self._held = self._held, []
        for short in held:
            short.close()

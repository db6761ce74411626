"""With a direct channel, the Docker server's very first code: stdin and stdout become the host.

``_astralvessel_connect`` connects to the turn's unix socket in
``_spec.CHANNEL_DIR`` and makes it the process's stdin and stdout; a host
that is gone (no listener) ends the container here. Like ``_boot_view``,
it is sent as text (``_bootstrap``): standard library only, Python 3.8.
"""

from __future__ import annotations


def _astralvessel_connect(path):  # type: (str) -> None
    # _socket, not socket: that one imports enum and selectors, memory an idle turn keeps.
    import _socket
    import os
    import sys

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sys.exit(f"astralvessel: cannot reach the host at {path}: {exc}")
    os.dup2(sock.fileno(), 0)
    os.dup2(sock.fileno(), 1)
    sock.close()

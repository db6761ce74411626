"""A warm sandbox adopted by a fork: its workspace laid on the fork's frozen layer then
(stdlib only, Python 3.8+).

A sandbox started ahead with an empty workspace (``Executor(warm=N)``) can serve a
fork of a turn started after it: the host passes the fork's frozen layer (a detached
mount, as a cold fork's hello would) over the socket it handed the server at spawn
(``Hello.adopt_socket``), and sends ``adopt``. The server lays the overlay on its
workspace as its hello would have (``_lowerfs.overlay_workspace``), then makes the
outbox again in it.

Only a sandbox that nothing has touched may be adopted: no call, no file request,
no freeze came, and its workspace is its own empty tmpfs. Anything a call or a file
request did could survive under the overlay (a process holding the old tmpfs open, a
file the fork would then see, a mount namespace copied before the overlay): such a
sandbox is refused, and the host starts the fork's own.
"""

from __future__ import annotations

import errno
import os

from . import _hello, _lowerfs, _passfd
from ._calls import map_path
from ._freeze import not_here, refused
from ._lean import suppress

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._launch import LaunchPlan
    from ._messages import Hello

__all__ = ["lay", "refusal", "take_layer"]


def refusal(config: Hello, plan: LaunchPlan, path_map: dict[str, str], touched: str) -> Any:
    """Why this sandbox may not be adopted (an ``fs_result``'s error), or None.

    ``touched``: what the host already asked of it (empty: nothing)."""
    if touched:
        return refused(errno.EBUSY, f"the sandbox already served {touched}: only a fresh one")
    if config.workspace_lower is not None or config.workspace_lower_fd is not None:
        return refused(errno.EEXIST, "the workspace already lies on a lower layer")
    if config.egress is not None:
        return refused(errno.EOPNOTSUPP, "a turn with a network keeps its own sandbox")
    return not_here(config, plan, path_map)


def take_layer(socket_fd: int | None) -> int:
    """The frozen layer the host passed over the adoption socket before its ``adopt``.

    Raises ``OSError`` where there is no socket or nothing waits on it."""
    if socket_fd is None:
        raise OSError(errno.EOPNOTSUPP, "this sandbox was started without an adoption socket")
    sock = _passfd.host_socket(socket_fd)
    if sock is None:
        raise OSError(errno.ENOTSOCK, "the adoption descriptor is no socket")
    try:
        sock.setblocking(False)
        try:
            _, fds = _passfd.receive(sock, 1)
        except BlockingIOError:
            raise OSError(errno.EBADF, "no layer was passed with the adopt request") from None
    finally:
        sock.close()
    for extra in fds[1:]:
        with suppress(OSError):
            os.close(extra)
    if not fds:
        raise OSError(errno.EBADF, "no layer was passed with the adopt request")
    return fds[0]


def lay(
    config: Hello, path_map: dict[str, str], layer: int, sources_to: list[int] | None = None
) -> int:
    """Lay the workspace's overlay on ``layer`` and make the outbox in it; the upper
    layer's descriptor (for the file worker). Raises ``OSError`` where the overlay is
    refused, the workspace then left as it was."""
    workspace = map_path(config.workspace, path_map)
    outbox = map_path(config.outbox, path_map)
    upper = _lowerfs.overlay_workspace(
        workspace,
        None,
        config.drop_uid,
        config.drop_gid,
        held=layer,
        movable=True,
        sources_to=sources_to,
    )
    _hello.clear_lower_outbox(outbox)
    _hello.prepare_workspace(workspace, outbox, config.drop_uid, config.drop_gid)
    return upper

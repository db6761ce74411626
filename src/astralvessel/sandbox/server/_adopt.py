"""A warm sandbox adopted by a fork: its workspace laid on the fork's frozen layer then
(stdlib only, Python 3.8+).

A sandbox started ahead with an empty workspace (``Executor(warm=N)``) can serve a
fork of a turn started after it: the host passes the fork's frozen layer (a detached
mount, as a cold fork's hello would) over the socket it handed the server at spawn
(``Hello.adopt_socket``), and sends ``adopt``. A fork of a fork passes its stack, every
layer in one message, top first. The server lays the overlay on its workspace as its
hello would have (``_lowerfs.overlay_workspace``), keeping the overlay's lower layers
for a later freeze to stack on, then makes the outbox again in it.

Root's Docker host lays the overlay itself instead (``Adopt.laid``: its layers' whiteouts
are ``trusted.*`` attributes, which an overlay laid in the container's user namespace
would not read) and moves it onto the workspace in the server's mount namespace; it
passes no layer, and the server checks that its workspace is an overlay now, not its
own tmpfs, before it makes its outbox and views again there.

Only a sandbox that nothing has touched may be adopted: no call, no file request,
no freeze came, and its workspace is its own empty tmpfs. Anything a call or a file
request did could survive under the overlay (a process holding the old tmpfs open, a
file the fork would then see, a mount namespace copied before the overlay): such a
sandbox is refused, and the host starts the fork's own.
"""

from __future__ import annotations

import errno
import os
import stat

from . import _hello, _lowerfs, _passfd
from ._calls import map_path
from ._freeze import OVERLAYFS_MAGIC, fstatfs_type, not_here, refused
from ._lean import suppress
from ._messages import MAX_LAYERS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._launch import LaunchPlan
    from ._messages import Hello

__all__ = [
    "check_laid",
    "checked_layers",
    "lay",
    "made_ready",
    "nothing_passed",
    "refusal",
    "take_layers",
]


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


def take_layers(socket_fd: int | None) -> list[int]:
    """The frozen layers the host passed over the adoption socket before its ``adopt``,
    top first: one, or a stack's (a fork of a fork's: its own layer over its parent's).

    Raises ``OSError`` where there is no socket, nothing waits on it, or what came is
    no stack of layers (``checked_layers``); every descriptor that came is then closed."""
    waiting = _waiting(socket_fd)
    if waiting is None:
        raise OSError(errno.EBADF, "no layer was passed with the adopt request")
    _, fds = waiting
    try:
        checked_layers(fds)
    except OSError:
        _close_all(fds)
        raise
    return fds


def nothing_passed(socket_fd: int | None) -> None:
    """Raise ``OSError`` unless ``socket_fd`` is an adoption socket with nothing waiting on
    it: an adoption the host laid itself comes with no layer (any that came is closed)."""
    waiting = _waiting(socket_fd)
    if waiting is None:
        return
    data, fds = waiting
    _close_all(fds)
    if data or fds:
        raise OSError(errno.EINVAL, "a layer was passed with an adoption the host laid")


def _waiting(socket_fd: int | None) -> tuple[bytes, list[int]] | None:
    """What waits on the adoption socket, with the descriptors passed along (None: nothing).

    Raises ``OSError`` where the sandbox has no adoption socket."""
    if socket_fd is None:
        raise OSError(errno.EOPNOTSUPP, "this sandbox was started without an adoption socket")
    sock = _passfd.host_socket(socket_fd)
    if sock is None:
        raise OSError(errno.ENOTSOCK, "the adoption descriptor is no socket")
    try:
        sock.setblocking(False)
        try:
            # Room for one past the most: a host that passed more is told so, not cut short.
            data, fds = _passfd.receive(sock, 1, MAX_LAYERS + 1)
        except BlockingIOError:
            return None
    finally:
        sock.close()
    return data, fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with suppress(OSError):
            os.close(fd)


def checked_layers(fds: list[int]) -> None:
    """Raise ``OSError`` unless ``fds`` are 1 to ``MAX_LAYERS`` frozen layers: each the
    root of a detached read-only mount of a folder (what a freeze hands the host, or
    root's host clones of it), never a folder of a mount the host could write through."""
    if not fds:
        raise OSError(errno.EBADF, "no layer was passed with the adopt request")
    if len(fds) > MAX_LAYERS:
        raise OSError(errno.E2BIG, f"{len(fds)} layers were passed: {MAX_LAYERS} at most")
    for index, fd in enumerate(fds):
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, f"layer {index} is no folder")
        if not os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, f"layer {index} is no read-only mount")
        # A detached mount's root is its own parent; a folder of any other mount is not.
        parent = os.stat("..", dir_fd=fd)
        if (parent.st_dev, parent.st_ino) != (st.st_dev, st.st_ino):
            raise OSError(errno.EINVAL, f"layer {index} is no detached mount's root")


def check_laid(config: Hello, path_map: dict[str, str]) -> None:
    """Raise ``OSError`` unless the workspace is now an overlay: where root's Docker host
    laid it itself (``Adopt.laid``), over the container's own tmpfs. The server never laid
    one there (an adoption is its first request), so an overlay is the host's; a workspace
    still its tmpfs (nothing laid) is refused, ``EINVAL``."""
    workspace = map_path(config.workspace, path_map)
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        kind = fstatfs_type(fd)
    finally:
        os.close(fd)
    if kind != OVERLAYFS_MAGIC:
        raise OSError(errno.EINVAL, "the workspace is no overlay the host laid")


def made_ready(config: Hello, path_map: dict[str, str]) -> None:
    """Make the outbox in the workspace the host laid (``check_laid``), as ``lay`` does in
    its own: the host cleared the frozen layer's outbox already."""
    workspace = map_path(config.workspace, path_map)
    outbox = map_path(config.outbox, path_map)
    _hello.clear_lower_outbox(outbox)
    _hello.prepare_workspace(workspace, outbox, config.drop_uid, config.drop_gid)


def lay(
    config: Hello, path_map: dict[str, str], layers: list[int], sources_to: list[int] | None = None
) -> int:
    """Lay the workspace's overlay on ``layers`` (top first) and make the outbox in it, as
    a hello's ``workspace_lower_fd`` and ``workspace_below_fds`` would; the upper layer's
    descriptor (for the file worker). ``sources_to`` takes the overlay's lower layers, for
    a freeze that stacks this fork's own layer over them. Raises ``OSError`` where the
    overlay is refused, the workspace then left as it was."""
    workspace = map_path(config.workspace, path_map)
    outbox = map_path(config.outbox, path_map)
    upper = _lowerfs.overlay_workspace(
        workspace,
        None,
        config.drop_uid,
        config.drop_gid,
        held=layers[0],
        below=tuple(layers[1:]),
        movable=True,
        sources_to=sources_to,
    )
    _hello.clear_lower_outbox(outbox)
    _hello.prepare_workspace(workspace, outbox, config.drop_uid, config.drop_gid)
    return upper

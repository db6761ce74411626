"""The host's side of a workspace frozen in place: ask for the freeze, take the clone.

The sandbox server freezes its workspace's tmpfs read-only and keeps a detached
mount of it (``server/_freeze``); its answer names that mount's descriptor in
the server. The host copies it across with ``pidfd_getfd`` (Linux 5.6), which
asks the same as ``ptrace``: the server is the host's descendant (Yama's
``ptrace_scope`` 1 allows that), and either the host is root, or the host's
user owns the sandbox's user namespace and so holds ``CAP_SYS_PTRACE`` there
(which an undumpable server requires). Then the server closes its copy.

The server's pid is its own namespace's; the host finds the process by walking
down from the process it started (bubblewrap, or util-linux ``unshare`` above
nsjail, or nsjail itself) to the first descendant whose innermost ``NSpid`` is
that number (the server comes before any of its calls, which are deeper), and
checks the descriptor it got is the mount the server described (device and
inode), so a pid reused meanwhile cannot hand over anything else.

A Docker turn's server is no descendant of the host. As root the host does the mount
steps itself in the server's mount namespace (``docker._freeze``). An ordinary user's
server holds the workspace's tmpfs it made (``server/_heldfs``, asked where the direct
channel serves) and passes it with its answer over the channel's unix socket
(``SCM_RIGHTS``, ``Freeze.passed``), checked alike; elsewhere (the attach stream) the
freeze is refused (``EOPNOTSUPP``) before anything changes.
A session the host did not start as a local process cannot be asked: ``freeze``
then raises ``ENOSYS`` before anything changes in the sandbox.
"""

from __future__ import annotations

import errno
import os
from collections import deque
from typing import Any

from ._api import FsRequest, LayerLost, SandboxSession
from .server import _sys

__all__ = ["LayerLost", "freeze", "freeze_fork_layer", "server_pid"]


#: How many processes the walk down from the started one looks at, at most.
_WALK_LIMIT = 4096


def _children(pid: int) -> list[int]:
    """``pid``'s children (of each of its threads); none if it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


def _innermost_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def server_pid(session: SandboxSession) -> int:
    """The host's pid of ``session``'s server; raises ``OSError`` (``ENOSYS``: no local
    process; ``ESRCH``: none found)."""
    process = getattr(getattr(session, "channel", None), "process", None)
    inner = getattr(session, "ready_info", {}).get("pid")
    if process is None or not isinstance(inner, int):
        raise OSError(errno.ENOSYS, f"the {session.backend} sandbox is not a process of this host")
    queue = deque([int(process.pid)])
    seen = 0
    while queue and seen < _WALK_LIMIT:
        pid = queue.popleft()
        seen += 1
        if _innermost_pid(pid) == inner:
            return pid
        queue.extend(_children(pid))
    raise OSError(errno.ESRCH, f"the {session.backend} sandbox server's process was not found")


def _refusal(reply_errno: str, message: str) -> OSError:
    code = getattr(errno, reply_errno, errno.EIO)
    return OSError(code, message or os.strerror(code))


def freeze(
    session: SandboxSession, upper_bytes: int, *, timeout: float = 30.0, held_only: bool = False
) -> int:
    """Freeze ``session``'s workspace in place; return the host's descriptor of the clone.

    The descriptor (close-on-exec, the caller's to close) is a detached, read-only
    mount of the workspace as it was; the turn writes on from then on in an overlay
    above it, its new layer holding at most ``upper_bytes``. Raises ``OSError``
    with the sandbox's errno when it cannot be done (``EBUSY``: a file is open for
    writing in the sandbox; ``EOPNOTSUPP``, ``EPERM``, ``ENOSYS``...): the
    workspace is then as it was, unless the freeze was made and only the take
    failed (``EPERM`` from ``pidfd_getfd``), in which case the turn writes on in
    its overlay and only the clone is lost. ``held_only``: take only the server's held
    original of the workspace's tmpfs (``server/_heldfs``), which forks in other user
    namespaces can clone (``EOPNOTSUPP`` before anything changes where it holds none).
    """
    passes = session.backend == "docker" and os.geteuid() != 0
    if session.backend == "docker" and not passes:  # no local server process: the host
        from .docker._freeze import freeze as host_freeze  # mounts (root); lazy: no docker/

        fd = host_freeze(session, upper_bytes, timeout=timeout)
        _widen_memory(session, fd)
        return fd
    # An ordinary user's Docker host takes the server's held original over the direct
    # channel's socket, passed with the answer (it may not pidfd_getfd a container's process).
    channel = getattr(session, "channel", None) if passes else None
    take_passed = getattr(channel, "take_passed", None)
    if passes and take_passed is None:
        raise OSError(errno.EOPNOTSUPP, "the turn's channel carries no descriptors")
    fields: dict[str, object] = {"upper_bytes": upper_bytes, "held": held_only or passes}
    if passes:
        fields["passed"] = True
    fd, _ = _taken_from(session, fields, timeout, take_passed)
    _widen_memory(session, fd)
    return fd


def freeze_fork_layer(
    session: SandboxSession, upper_bytes: int, *, timeout: float = 30.0
) -> tuple[int, bool]:
    """Freeze a fork's own upper layer in place (``server/_freeze.freeze_fork``): the turn
    lies on the host's layers, and its forks will lie on this one above them. Returns the
    host's descriptor of that layer (as ``freeze``'s) and whether its overlay's attributes
    are ``user.*`` ones (``userxattr``), for the host's overlay of the stack to read its
    whiteouts alike. Bubblewrap and nsjail, whose server the host takes descriptors from,
    and Docker: as root, whose fork's overlay the host laid itself (``docker._freeze``);
    as an ordinary user, whose server passes it over the direct channel's socket (as
    ``freeze`` takes a fresh turn's). Raises ``OSError`` as ``freeze`` does
    (``EOPNOTSUPP``: not such a fork, or no socket to pass it on)."""
    if session.backend == "docker" and os.geteuid() == 0:
        from .docker._freeze import freeze_fork_layer as host_freeze_fork_layer  # lazy

        fd = host_freeze_fork_layer(session, upper_bytes, timeout=timeout)
        _widen_memory(session, fd)
        return fd, False  # the host's overlay: trusted.* attributes
    passes = session.backend == "docker"
    if session.backend not in ("bubblewrap", "nsjail") and not passes:
        raise OSError(errno.EOPNOTSUPP, f"a {session.backend} fork's layer is not stacked")
    take_passed = getattr(getattr(session, "channel", None), "take_passed", None)
    if passes and take_passed is None:
        raise OSError(errno.EOPNOTSUPP, "the turn's channel carries no descriptors")
    # An ordinary user's forks clone the layer in their own namespaces: only a clone of the
    # server's held tmpfs will do (refused before anything changes otherwise).
    fields: dict[str, object] = {"upper_bytes": upper_bytes, "stack": True}
    if os.geteuid() != 0:
        fields["held"] = True
    if passes:
        fields["passed"] = True
    fd, reply = _taken_from(session, fields, timeout, take_passed if passes else None)
    userxattr = reply.get("userxattr")
    if not isinstance(userxattr, bool):
        os.close(fd)
        raise LayerLost(errno.EPROTO, f"the freeze's answer names no attribute mode: {reply!r}")
    _widen_memory(session, fd)
    return fd, userxattr


def _taken_from(
    session: SandboxSession, fields: dict[str, object], timeout: float, take_passed: Any
) -> tuple[int, dict[str, Any]]:
    """Ask the freeze, take the descriptor its answer names, release the server's copy."""
    pid = -1 if take_passed else server_pid(session)
    reply = session.fs(FsRequest(op="freeze", timeout=timeout, fields=fields))
    if reply.errno is not None:
        raise _refusal(reply.errno, reply.message)
    number = reply.fields.get("fd")
    if not isinstance(number, int):
        raise LayerLost(errno.EPROTO, f"the freeze's answer names no descriptor: {reply.fields!r}")
    try:
        dev, ino = reply.fields.get("dev"), reply.fields.get("ino")
        fd = _taken(take_passed(), dev, ino) if take_passed else _take(pid, number, dev, ino)
    except OSError as exc:  # the sandbox froze: the turn writes on, the layer is lost
        raise LayerLost(exc.errno or errno.EIO, str(exc)) from exc
    finally:
        released = session.fs(
            FsRequest(op="freeze", timeout=timeout, fields={"phase": "release", "fd": number})
        )
        if released.errno is not None:  # pragma: no cover - the server holds what it named
            raise _refusal(released.errno, released.message)
    return fd, dict(reply.fields)


def _widen_memory(session: SandboxSession, fd: int) -> None:
    """Raise the turn's memory bound by the frozen tmpfs's pages.

    They stay charged to the turn's memory group (a tmpfs page is charged to the group
    that wrote it, until it is freed), while the turn writes on in a new layer bounded
    by its disk limit: unwidened, every byte frozen would be taken from its calls'
    memory, and a turn that forked a full workspace could not rewrite it without its
    calls being killed. The forks' own writes are charged to their own groups.
    """
    widen = getattr(session, "widen_memory", None)
    if widen is None:
        return
    try:
        stats = os.fstatvfs(fd)
        widen((stats.f_blocks - stats.f_bfree) * stats.f_frsize)
    except (OSError, ValueError):
        pass  # the bound stays as it was: the turn is no worse off than before the freeze


def _taken(fd: int | None, dev: object, ino: object) -> int:
    """The descriptor the server passed with its answer, checked to be the named mount."""
    if fd is None:
        raise OSError(errno.EPROTO, "the freeze's answer came without its descriptor")
    return _named(fd, dev, ino, "the descriptor passed")


def _take(pid: int, number: int, dev: object, ino: object) -> int:
    """A copy of descriptor ``number`` of process ``pid``, checked to be the named mount."""
    pidfd = _sys.pidfd_open(pid)
    try:
        fd = _sys.pidfd_getfd(pidfd, number)
    finally:
        os.close(pidfd)
    return _named(fd, dev, ino, f"process {pid}'s descriptor {number}")


def _named(fd: int, dev: object, ino: object, what: str) -> int:
    """``fd`` if it is the mount the server's answer named (device and inode), else closed
    and ``ESRCH``: a pid reused, or a descriptor passed that is not the frozen clone."""
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if (st.st_dev, st.st_ino) != (dev, ino):
        os.close(fd)
        raise OSError(errno.ESRCH, f"{what} is not the frozen clone")
    return fd

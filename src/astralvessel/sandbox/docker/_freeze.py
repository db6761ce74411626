"""A Docker turn's workspace frozen in place by the host (root), in the server's mount namespace.

The container's server cannot freeze its workspace itself: the tmpfs is the
engine's (its superblock belongs to the host's user namespace), and the server
holds ``CAP_SYS_ADMIN`` only in the user namespace its bootstrap made. Root on
the host holds it over both, so the host runs the server's own steps
(``server/_freeze.freeze_workspace``: the clone, the superblock read-only, the
bounded upper layer, the overlay moved onto ``/workspace``) in the server's
mount namespace, and the server does what only it can around them:

1. ``prepare``: the server refuses while a call or detached process runs
   (``EBUSY``), or where the workspace is not its own tmpfs (``EOPNOTSUPP``),
   and changes nothing;
2. the host's step, in a child of its own: ``setns`` asks a single-threaded
   process (this host process has threads), and the child imports only the
   stdlib and ``server/``, as ``_cow``'s does. It sends the clone back over a
   socket pair (``SCM_RIGHTS``); a step refused there leaves the tmpfs thawed
   and the workspace as it was, and one killed at its timeout (which undoes
   nothing) is followed by a second child that thaws the tmpfs it left
   read-only with no overlay;
3. ``frozen``, sent whatever the child did: the file worker and the spare
   call's namespaces copied the old view, so the server makes them again.

The server is the container's first process: the engine names its host pid
(``State.Pid``), which is checked to be that container's (its cgroup names the
container's id) and the server (its innermost pid is the one its ``ready``
gave) through one ``/proc`` folder descriptor, which stays that process's
however the pid is reused, and the mount namespace is opened through it too.
A layer made so is the host's overlay's (``trusted.*`` attributes, as root's on
bubblewrap); the new upper layer is detached in the container, so the server's
listing marks no file the frozen layer's, and a later snapshot of the turn
reads every file through the sandbox.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from .._api import FsRequest, LayerLost, SandboxSession
from ..server import _snapfiles, _sys
from ..server._freeze import thaw_fork_layer
from ._cow import HostOverlay

__all__ = ["childs_error", "freeze", "freeze_fork_layer", "server_folder"]

#: The server's own steps in the server's mount namespace: ``argv`` is the folder holding
#: ``server/``, the namespace's and the socket's descriptors, the workspace, the upper
#: layer's bytes and inodes. It sends the clone, then the new upper layer's folder if it
#: could open it. An ``OSError``'s errno name is its last line's first word.
_FREEZE = (
    "import errno, socket, sys; sys.path.insert(0, sys.argv[1]); from server import _sys; "
    "from server._freeze import freeze_workspace\n"
    "upper = []\n"
    "try:\n"
    " _sys.setns(int(sys.argv[2]), _sys.CLONE_NEWNS)\n"
    " clone = freeze_workspace(\n"
    "  sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), userxattr=False, upper_to=upper.append\n"
    " )\n"
    "except OSError as exc:\n"
    " sys.exit(errno.errorcode.get(exc.errno or 0, 'EIO') + ' ' + str(exc.strerror or exc))\n"
    "socket.send_fds(socket.socket(fileno=int(sys.argv[3])), [b'f'], [clone, *upper])"
)
#: A step's child killed at its timeout undoes nothing: this one, in the same namespace,
#: thaws the tmpfs where that left it read-only with no overlay (``thaw_unlaid``).
_THAW = (
    "import sys; sys.path.insert(0, sys.argv[1]); from server import _sys; "
    "from server._freeze import thaw_unlaid\n"
    "_sys.setns(int(sys.argv[2]), _sys.CLONE_NEWNS)\n"
    "thaw_unlaid(sys.argv[3])"
)
#: A fork's own layer frozen (``server/_freeze.freeze_fork``): its overlay is the host's
#: (``_cow.HostOverlay``), so the child freezes the layer and makes the new overlay here,
#: on the host's mounts, and moves it onto ``/workspace`` in the server's mount namespace.
#: ``argv``: the folder holding ``server/``, the namespace's and the socket's descriptors,
#: the workspace there, the host's overlay, its upper folder's descriptor, the upper
#: layer's bytes and inodes, then the lower layers' descriptors, top first. It sends the
#: clone of the layer, then the new upper layer's folder if it could open it.
_FREEZE_FORK = (
    "import errno, socket, sys; sys.path.insert(0, sys.argv[1]); "
    "from server._freeze import freeze_fork\n"
    "upper = []\n"
    "try:\n"
    " clone = freeze_fork(\n"
    "  sys.argv[5], int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), userxattr=False,\n"
    "  upper_to=upper.append, lowers=[int(fd) for fd in sys.argv[9:]],\n"
    "  move_into=(int(sys.argv[2]), sys.argv[4]),\n"
    " )\n"
    "except OSError as exc:\n"
    " sys.exit(errno.errorcode.get(exc.errno or 0, 'EIO') + ' ' + str(exc.strerror or exc))\n"
    "socket.send_fds(socket.socket(fileno=int(sys.argv[3])), [b'f'], [clone, *upper])"
)
#: The folder holding ``server/`` (the child imports it as a top-level package).
_SERVER_PARENT = str(Path(_sys.__file__).parent.parent)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def freeze(session: SandboxSession, upper_bytes: int, *, timeout: float = 30.0) -> int:
    """Freeze the Docker ``session``'s workspace in place; the host's descriptor of the clone.

    As ``sandbox._frozen.freeze``: a detached, read-only mount of the workspace as it
    was, close-on-exec, the caller's; ``OSError`` when it is not made (``ENOSYS``: the
    server is no process of this host; ``EBUSY``, ``EOPNOTSUPP``: the server's
    refusals; ``EPERM``: not root), the workspace then as it was.
    """
    proc = server_folder(session)
    try:
        ready = _ask(session, {"phase": "prepare"}, timeout)
        workspace, inodes = ready.get("workspace"), ready.get("inodes")
        if not isinstance(workspace, str) or not isinstance(inodes, int):
            raise OSError(errno.EPROTO, f"the server's prepare names no workspace: {ready!r}")
        namespace = os.open("ns/mnt", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    finally:
        os.close(proc)
    try:
        clone, upper = _frozen_by_child(namespace, workspace, upper_bytes, inodes, timeout)
        if upper >= 0:
            _listed_by_the_host(session, upper)
        return clone
    finally:
        os.close(namespace)
        # Laid or not, the server makes again what copied the view before the child ran.
        _ask(session, {"phase": "frozen"}, timeout)


def freeze_fork_layer(session: SandboxSession, upper_bytes: int, *, timeout: float = 30.0) -> int:
    """Freeze the own upper layer of the Docker fork ``session`` (its workspace the host's
    overlay on a snapshot's layers, ``_cow.HostOverlay``) in place; the host's descriptor
    of that layer alone, as ``freeze``'s. The fork writes on in a new overlay on that layer
    over the old one's lower layers, flat (``server/_freeze.freeze_fork``); its attributes
    are ``trusted.*`` ones. Raises ``OSError`` as ``freeze`` does (``EOPNOTSUPP``: no
    overlay of the host's, or its layer frozen already); ``LayerLost`` where the layer
    was frozen and the host could not take it."""
    overlay = _laid_by_the_host(session)
    held = None if overlay is None else overlay.layer_descriptors()
    if overlay is None or held is None:
        why = "the Docker turn lies on no overlay the host laid, or froze its layer already"
        raise OSError(errno.EOPNOTSUPP, why)
    upper, lowers = held
    try:
        proc = server_folder(session)
        try:
            clone, new_upper = _fork_frozen(
                session, proc, overlay, (upper, lowers), upper_bytes, timeout
            )
        finally:
            os.close(proc)
    finally:
        for fd in (upper, *lowers):
            os.close(fd)
    if new_upper >= 0:
        _listed_by_the_host(session, new_upper)
    return clone


def _fork_frozen(  # noqa: PLR0917 - the steps' inputs, in order
    session: SandboxSession,
    proc: int,
    overlay: HostOverlay,
    layers: tuple[int, list[int]],
    upper_bytes: int,
    timeout: float,
) -> tuple[int, int]:
    """The server's ``prepare``, ``_FREEZE_FORK`` in a child, the server's ``frozen``: the
    clone of the layer and the new upper layer's folder (-1: none). ``layers``: the upper
    folder's descriptor and the lower layers', top first."""
    upper, lowers = layers
    ready = _ask(session, {"phase": "prepare"}, timeout)
    workspace, inodes = ready.get("workspace"), ready.get("inodes")
    if not isinstance(workspace, str) or not isinstance(inodes, int):
        raise OSError(errno.EPROTO, f"the server's prepare names no workspace: {ready!r}")
    namespace = os.open("ns/mnt", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    argv = [
        _FREEZE_FORK, str(namespace), workspace, overlay.workspace, str(upper),
        str(upper_bytes), str(inodes), *(str(fd) for fd in lowers),
    ]  # fmt: skip
    killed = functools.partial(_fork_left, session, proc, workspace, overlay, upper)
    try:
        sent = _sent_by_child(argv, (namespace, upper, *lowers), timeout, killed)
    except BaseException as exc:
        os.close(namespace)
        if isinstance(exc, LayerLost):
            _unlisted(session)
        _ask(session, {"phase": "frozen"}, timeout)  # laid or not, the views are made again
        raise
    os.close(namespace)
    try:
        _ask(session, {"phase": "frozen"}, timeout)
    except OSError as exc:  # the turn writes on above the layer, its views not made again
        for fd in sent:
            if fd >= 0:
                os.close(fd)
        _unlisted(session)
        why = f"the server did not remake its views: {exc}"
        raise LayerLost(exc.errno or errno.EIO, why) from exc
    return sent


def _laid_by_the_host(session: SandboxSession) -> HostOverlay | None:
    """The host's overlay ``session``'s workspace is, while its upper layer is the turn's
    (its listing is ``session.upper_names``, which a freeze hands to the new layer)."""
    owner = getattr(getattr(session, "upper_names", None), "__self__", None)
    return owner if isinstance(owner, HostOverlay) else None


def _fork_left(
    session: SandboxSession, proc: int, workspace: str, overlay: HostOverlay, upper: int
) -> None:
    """What a fork's freeze killed at its timeout left: where the container's workspace is
    the host's overlay still, its layer's tmpfs thawed (``thaw_fork_layer``); where the new
    overlay was moved there, the layer is lost to the host (``LayerLost``), and the turn's
    snapshots read every file (the host lists no layer of it)."""
    try:
        laid = os.stat(f"root{workspace}", dir_fd=proc).st_dev != os.stat(overlay.workspace).st_dev
    except OSError as exc:
        raise OSError(errno.ETIMEDOUT, f"a fork's freeze did not end in time: {exc}") from None
    if not laid:
        try:
            thaw_fork_layer(upper)
        except OSError as exc:
            raise OSError(
                errno.ETIMEDOUT,
                f"a fork's freeze did not end in time and it could not be thawed ({exc}): "
                "the workspace may be left read-only",
            ) from None
        return
    _unlisted(session)
    raise LayerLost(errno.ETIMEDOUT, "a fork's freeze did not end in time; its layer is lost")


def _unlisted(session: SandboxSession) -> None:
    """The turn writes on above a layer lost to the host: its snapshots read every file
    (its old overlay's listing would miss what it writes from now on)."""
    if hasattr(session, "upper_names"):
        session.upper_names = _unknown


def _unknown() -> frozenset[bytes] | None:
    """No listing of the turn's upper layer: its snapshots read every file."""
    return None


def _ask(session: SandboxSession, fields: dict[str, object], timeout: float) -> dict[str, object]:
    reply = session.fs(FsRequest(op="freeze", timeout=timeout, fields=fields))
    if reply.errno is not None:
        code = getattr(errno, reply.errno, errno.EIO)
        raise OSError(code, reply.message or os.strerror(code))
    return dict(reply.fields)


def server_folder(session: SandboxSession) -> int:
    """A descriptor of the server's ``/proc`` folder, checked to be that container's server."""
    channel = getattr(session, "channel", None)
    host_pid = getattr(channel, "host_pid", None)
    container = getattr(channel, "container_id", None)
    inner = getattr(session, "ready_info", {}).get("pid")
    if host_pid is None or not isinstance(container, str) or not isinstance(inner, int):
        raise OSError(errno.ENOSYS, f"the {session.backend} sandbox is not a process of this host")
    pid = host_pid()
    if not isinstance(pid, int) or pid <= 0:
        raise OSError(errno.ESRCH, "the turn's container does not run")
    not_here = OSError(errno.ENOSYS, "the container's server is not a process of this host")
    try:
        proc = os.open(f"/proc/{pid}", _DIR_FLAGS)
    except FileNotFoundError:
        raise not_here from None
    try:
        ours = container in _read(proc, "cgroup") and _innermost_pid(_read(proc, "status")) == inner
    except BaseException:
        os.close(proc)
        raise
    if not ours:
        os.close(proc)
        raise not_here
    return proc


def _read(folder: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=folder)
    try:
        return os.read(fd, 1 << 16).decode("ascii", "replace")
    finally:
        os.close(fd)


def _innermost_pid(status: str) -> int | None:
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return None


def _frozen_by_child(
    namespace: int, workspace: str, upper_bytes: int, inodes: int, timeout: float
) -> tuple[int, int]:
    """``freeze_workspace`` run by a child in mount namespace ``namespace``: the clone and
    the new upper layer's folder (-1: none was sent)."""
    argv = [_FREEZE, str(namespace), workspace, str(upper_bytes), str(inodes)]
    return _sent_by_child(
        argv, (namespace,), timeout, lambda: _thaw_by_child(namespace, workspace, timeout)
    )


def _sent_by_child(
    argv: list[str], fds: tuple[int, ...], timeout: float, killed: Callable[[], None]
) -> tuple[int, int]:
    """Run the step ``argv`` (a script, then its arguments: the socket's descriptor is put
    second) in a child passed ``fds``: the clone and the new upper layer's folder it sends
    (-1: none). ``killed`` is called where the child was killed at its timeout, and says
    what that left (the ``ETIMEDOUT`` raised then, unless it raises its own)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        script, first, *rest = argv
        command = [
            sys.executable, "-I", "-S", "-c", script, _SERVER_PARENT, first,
            str(theirs.fileno()), *rest,
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command,
                pass_fds=(*fds, theirs.fileno()),
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            killed()
            raise OSError(errno.ETIMEDOUT, "the workspace's freeze did not end in time") from None
        theirs.close()
        if done.returncode != 0:
            raise childs_error(done.stderr)
        try:
            _, sent, _, _ = socket.recv_fds(ours, 1, 2)
        except OSError as exc:
            why = f"the freeze's clone was not taken: {exc}"
            raise LayerLost(exc.errno or errno.EIO, why) from exc
    if not sent:  # the child froze and laid all: the turn writes on above a layer lost
        raise LayerLost(errno.EPROTO, "the freeze's child sent no clone")
    return sent[0], sent[1] if len(sent) > 1 else -1


def _thaw_by_child(namespace: int, workspace: str, timeout: float) -> None:
    """Thaw the workspace a killed step may have left read-only (``_THAW``), or say why not:
    the turn then cannot write its workspace, and the error says so."""
    argv = [sys.executable, "-I", "-S", "-c", _THAW, _SERVER_PARENT, str(namespace), workspace]
    try:
        done = subprocess.run(
            argv, pass_fds=(namespace,), capture_output=True, text=True, check=False,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise OSError(
            errno.ETIMEDOUT,
            "the workspace's freeze did not end in time, nor did its thaw: "
            "the workspace may be left read-only",
        ) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["it said nothing"])[-1]
        raise OSError(
            errno.ETIMEDOUT,
            f"the workspace's freeze did not end in time and it could not be thawed ({last}): "
            "the workspace may be left read-only",
        )


def childs_error(stderr: str, what: str = "the workspace cannot be frozen") -> OSError:
    """The child's refusal as an ``OSError``: its last line, ``ENAME message``, after
    ``what`` failed."""
    last = (stderr.strip().splitlines() or ["EIO the child said nothing"])[-1]
    name, _, message = last.partition(" ")
    code = getattr(errno, name, None)
    if not isinstance(code, int):
        return OSError(errno.EIO, f"{what}: {last}")
    return OSError(code, f"{what}: {message}")


class _HeldUpper:
    """The frozen turn's upper layer, held by the host for its snapshots' listings, as
    ``_cow.HostOverlay`` holds a turn's on a snapshot: the server's own worker cannot
    reach it (detached in a mount namespace where the host laid it)."""

    def __init__(self, upper: int) -> None:
        self._upper = upper
        self._lock = threading.Lock()

    def upper_names(self) -> frozenset[bytes] | None:
        """Every name the upper layer holds (``_snapfiles.upper_names``), or None: closed,
        or not walked whole (the snapshot then reads every file)."""
        with self._lock:
            if self._upper < 0:
                return None
            try:
                upper = os.dup(self._upper)
            except OSError:
                return None
        try:
            found = _snapfiles.upper_names(upper)
        finally:
            os.close(upper)
        return None if found is None else frozenset(found)

    def close(self) -> None:
        with self._lock:
            upper, self._upper = self._upper, -1
        if upper >= 0:
            os.close(upper)


def _listed_by_the_host(session: SandboxSession, upper: int) -> None:
    """Give ``session``'s snapshot listings the names ``upper`` holds, until it goes (the
    descriptor keeps the detached layer's memory: it is closed with the session)."""
    held = _HeldUpper(upper)
    if not hasattr(session, "upper_names"):
        held.close()
        return
    session.upper_names = held.upper_names
    weakref.finalize(session, held.close)

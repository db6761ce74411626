"""A warm Docker sandbox a fork may adopt: its adoption socket, passed with the hello.

The namespace backends hand an adoptable sandbox's server one end of a socket pair
at spawn (``Hello.adopt_socket``), and a fork's frozen layer comes on it later
(``server/_adopt``). A container inherits no descriptor of the host's, but the
direct channel (``_direct``) carries descriptors: the server's end goes with the
hello, after any frozen layer, as that layer does. Everything after is the
namespace backends' path: the server takes the layer from that socket, refuses it
once any request came (``EBUSY``), under a network or a writable root, or where it
is no mount it can clone (the workspace left as it was), and lays the overlay on
its workspace; its upper layer is in the workspace's tmpfs (counted against
``disk_mb``), and the file worker keeps its descriptor, so a snapshot of the fork
reads only the names it holds.

What differs is the layer: the container's server cannot idmap one (that needs
``CAP_SYS_ADMIN`` in the host's user namespace), so the layer it gets already shows
the parent's files as the fork's leased uid's (and each layer of a fork of a fork's
stack, one by one: ``ServerSession.adopt``). The host makes it so with its layer
reader (``_reader``: ``LayerReader.idmapped``), as root too, for two reasons. An
idmapped mount asks for a user namespace, which only a single-threaded process can
make: the host has threads, so a root host would start a child interpreter for each
fork (tens of milliseconds, where the adoption is meant to cost a few), while the
reader is a process already waiting for exactly this request, and already trusted
with it for an ordinary user's forks. And the second way, binding the warm
container's workspace from a host folder with slave propagation so that the host
could mount the overlay there later, would have every warm container's workspace
follow mounts made in a host folder, for the sake of the few that are adopted: the
adoption socket keeps each container's mounts its own.

Only where the channel is the direct one (a local engine, a leased uid): on the
engine's attach stream the sandbox is never adoptable, and forks start their own,
leaving the warm sandboxes to turns (``Docker.adopts_warm_here``, which the executor
asks before it offers a fork one).
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

from .._api import SandboxSession
from .._policy import WORKSPACE_DIR, Limits, Policy
from .._uids import UidLease
from ..server import _sys
from ._cow import HostOverlay
from ._freeze import childs_error, server_folder

__all__ = ["adoption_pair", "close_pair", "lay_adoption"]

#: Root's adoption: a clone of the host's overlay moved onto the workspace in the server's
#: mount namespace (``server/_freeze.move_overlay``), in a child (``setns`` asks a
#: single-threaded process). ``argv``: the folder holding ``server/``, the namespace's
#: descriptor, the overlay's path here, the workspace's there.
_MOVE = (
    "import errno, sys; sys.path.insert(0, sys.argv[1]); "
    "from server._freeze import move_overlay\n"
    "try:\n"
    " move_overlay(sys.argv[3], (int(sys.argv[2]), sys.argv[4]))\n"
    "except OSError as exc:\n"
    " sys.exit(errno.errorcode.get(exc.errno or 0, 'EIO') + ' ' + str(exc.strerror or exc))"
)
#: The folder holding ``server/`` (the child imports it as a top-level package).
_SERVER_PARENT = str(Path(_sys.__file__).parent.parent)

_Pair = tuple[socket.socket | None, socket.socket | None]


def adoption_pair(policy: Policy, lease: UidLease | None, *, direct: bool) -> _Pair:
    """The host's and the server's ends of an adoptable sandbox's socket, or two None:
    not asked (``Policy.adoptable``), a workspace already on a layer, or no direct
    channel to pass the server's end on."""
    if not policy.adoptable or not direct or lease is None:
        return None, None
    if policy.workspace_lower is not None or policy.workspace_lower_fd is not None:
        return None, None
    if policy.workspace_layers:
        return None, None
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def close_pair(host_end: socket.socket | None, server_end: socket.socket | None) -> _Pair:
    """Close both ends (either may be None); two None, for the caller's names."""
    for end in (host_end, server_end):
        if end is not None:
            end.close()
    return None, None


def lay_adoption(
    lease: UidLease,
    limits: Limits,
    session: SandboxSession,
    lower: str | tuple[str, ...],
    *,
    timeout: float,
) -> HostOverlay:
    """Root's adoption of the warm ``session`` by a fork on ``lower`` (the snapshot's tree,
    or its stack of layers, top first): the host lays the overlay itself, as for a cold
    fork (``_cow.HostOverlay``: ``trusted.*`` attributes, idmapped layers), and moves it
    onto the container's workspace, in the server's mount namespace. The server is then
    told (``Adopt.laid``). The overlay is the caller's to close (the container keeps its
    own mount of it); ``OSError`` where it is not laid (none is left then)."""
    overlay = HostOverlay(lower, lease.uid, lease.gid, limits)
    try:
        proc = server_folder(session)
        try:
            namespace = os.open("ns/mnt", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        finally:
            os.close(proc)
        try:
            _moved_by_child(namespace, overlay.workspace, timeout)
        finally:
            os.close(namespace)
    except BaseException:
        overlay.close()
        raise
    return overlay


def _moved_by_child(namespace: int, source: str, timeout: float) -> None:
    argv = [
        sys.executable, "-I", "-S", "-c", _MOVE, _SERVER_PARENT, str(namespace), source,
        str(WORKSPACE_DIR),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            argv, pass_fds=(namespace,), capture_output=True, text=True, check=False,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise OSError(errno.ETIMEDOUT, "the adoption's overlay was not moved in time") from None
    if done.returncode != 0:
        raise childs_error(done.stderr, "the adoption's overlay cannot be moved in")

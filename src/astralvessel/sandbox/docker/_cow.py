"""A Docker turn opened from a snapshot copy-on-write: the host (root) mounts the overlay.

The container's server cannot lay the overlay the namespace backends' servers
do: its mounts are made in the container's user namespace, where the store's
files (root's) map to no one, and an idmapped lower layer needs
``CAP_SYS_ADMIN`` in the host's user namespace. A root host has it, so it
mounts the workspace itself, in a folder of its own, and the container binds
that folder's overlay as its ``/workspace`` in place of its tmpfs:

- a **frame**: a small private tmpfs, so nothing mounted in it propagates to
  another mount namespace and one lazy unmount takes every layer with it;
- in it the turn's **workspace tmpfs**, as the container's would be (at most
  ``disk_mb``, the inode bound, ``nosuid,nodev``, owned by the turn's uid),
  which holds the overlay's upper layer: every byte a call writes or copies up
  counts against ``disk_mb``;
- a **bind of the snapshot's tree**, which the server's own routine
  (``server/_lowerfs.overlay_workspace``) clones idmapped (the store's owner
  shown as the turn's uid) as the lower layer, overlays on the workspace, and
  then covers: the store's tree is never written, and never reachable but
  through the overlay.

The host keeps a descriptor of the upper layer (opened through the workspace
tmpfs's own root, taken before the overlay covered it), as the namespace
backends' servers keep one for their file worker: a snapshot of the turn
reads only the names it holds (``upper_names``) and links the rest to the
snapshot's tree. The walk follows nothing (every folder opened by descriptor,
``O_NOFOLLOW``), so the calls' shaping of their layer can only make it find
more names changed, never reach a file outside it; a layer nested past
``UPPER_DEPTH`` (or one the host cannot read, or no descriptor left to read it
with) gives no names, and the snapshot reads every file.

The frame is unmounted (lazily, with everything in it) and removed when the
container is gone, and a host that died is swept by the next host process's
first turn opened from a snapshot (``remove_frames``). An ordinary user's host
cannot mount, so its turns copy (``docs/snapshots.md`` says why Docker's
``local`` volume driver does not serve either, as probed).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..._ground._leftovers import leftover_folders, owned_prefix
from .._policy import OUTBOX_DIR, WORKSPACE_DIR, Limits
from ..server import _hello, _lowerfs, _snapfiles, _sys

__all__ = ["HostOverlay", "remove_frames"]

#: The kind of the frames' folders: ``astralvessel-cow-<pid>-<start time>-...``.
_KIND = "cow"
#: The frame's own tmpfs: two mount points, or the workspace's and a stack's layers' (at
#: most ``MAX_LAYERS``, in one folder), nothing else.
_FRAME_OPTIONS = "size=16k,nr_inodes=16,mode=0755"
_MIB = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The server's own routine, run in a child of its own: it forks for the idmapped layer's
#: user namespace, and this host process has threads (3.12 warns of a fork among them,
#: and the suite makes that an error). The child reads only the stdlib and ``server/``.
#: ``argv``: the folder holding ``server/``, the workspace, the tree, uid, gid, how many
#: layers the tree holds (0: it is one), the socket it sends the overlay's lower layers on.
_LAY = (
    "import socket, sys; sys.path.insert(0, sys.argv[1]); "
    "from server._lowerfs import overlay_workspace\n"
    "sources = []\n"
    "overlay_workspace(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), "
    "layers=int(sys.argv[6]), sources_to=sources)\n"
    "socket.send_fds(socket.socket(fileno=int(sys.argv[7])), [b's'], sources)"
)
#: The server's outbox, as a name in the workspace.
_OUTBOX_NAME = str(OUTBOX_DIR.relative_to(WORKSPACE_DIR))
#: The folder holding ``server/`` (the child imports it as a top-level package).
_SERVER_PARENT = str(Path(_lowerfs.__file__).parent.parent)


def remove_frames(parent: str | None = None) -> int:
    """Unmount and remove the frames of dead host processes in ``parent``; return how many.

    Only real folders of this uid (root's) go; a frame's mounts go with it, lazily (a
    container still running on one keeps its own bind until the engine removes it).
    """
    removed = 0
    for entry in leftover_folders(_KIND, parent):
        with contextlib.suppress(OSError):
            _unmount_frame(entry.path)
            removed += 1
    return removed


@functools.cache
def _removed_once() -> None:
    """At this process's first frame only: the frames of the dead do not come back.

    (Two first frames at once may both sweep: a frame goes once, harmlessly.)
    """
    remove_frames()


def _unmount_frame(frame: str) -> None:
    if os.path.ismount(frame):
        _sys.check(_sys.libc().umount2(frame.encode(), _sys.MNT_DETACH), "umount the frame")
    os.rmdir(frame)


class HostOverlay:
    """A turn's workspace laid on ``lower`` by the host: bind ``workspace`` as ``/workspace``.

    ``lower``: the snapshot's tree, or a stack of frozen layers, top first (a fork of a
    fork's, ``Policy.workspace_layers``): each is bound apart and the overlay lies on them
    all, flat, each idmapped as a tree is. Raises ``OSError`` when a step is refused;
    nothing is left mounted then.
    """

    def __init__(self, lower: str | tuple[str, ...], uid: int, gid: int, limits: Limits) -> None:
        _removed_once()
        self.frame = tempfile.mkdtemp(prefix=owned_prefix(_KIND))
        self.workspace = os.path.join(self.frame, "workspace")
        #: The upper layer's folder (-1: none, or closed); ``_upper_lock`` keeps ``close``
        #: from closing it while ``upper_names`` takes its own copy.
        self._upper = -1
        #: The overlay's lower layers as it took them (``O_PATH``, top first): a freeze of
        #: the turn's own layer lays its next overlay on that layer over these
        #: (``docker._freeze.freeze_fork_layer``).
        self._sources: list[int] = []
        self._upper_lock = threading.Lock()
        try:
            flags = _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_NOEXEC
            _sys.mount("tmpfs", self.frame, "tmpfs", flags, _FRAME_OPTIONS)
            _sys.mount(None, self.frame, None, _sys.MS_PRIVATE | _sys.MS_REC)
            tree = os.path.join(self.frame, "lower")
            for folder in (self.workspace, tree):
                os.mkdir(folder, 0o755)
            _sys.mount(
                "tmpfs",
                self.workspace,
                "tmpfs",
                _sys.MS_NOSUID | _sys.MS_NODEV,
                f"size={limits.disk_mb * _MIB},nr_inodes={limits.workspace_inodes},"
                f"mode=0755,uid={uid},gid={gid}",
            )
            layers = _bound(lower, tree)
            # The tmpfs's root, before the overlay covers it: the upper layer is reached
            # through it alone once the overlay is on the workspace.
            below = os.open(self.workspace, _DIR_FLAGS)
            try:
                self._sources = _overlay(self.workspace, tree, uid, gid, layers)
                self._upper = os.open(f"{_lowerfs.LAYERS}/upper", _DIR_FLAGS, dir_fd=below)
            finally:
                os.close(below)
            # A frozen layer is a turn's whole workspace, its outbox too: the server's own
            # overlay clears it (``_hello``), this one the host, before the container starts.
            _hello.clear_lower_outbox(os.path.join(self.workspace, _OUTBOX_NAME))
        except BaseException:
            self.close()
            raise

    def upper_names(self) -> frozenset[bytes] | None:
        """Every name the turn's upper layer holds (``_snapfiles.upper_names``), or None:
        the overlay is closed, or its upper layer cannot be walked whole."""
        with self._upper_lock:
            if self._upper < 0:
                return None
            try:
                upper = os.dup(self._upper)
            except OSError:  # EMFILE, ENFILE: unknown, so the snapshot reads every file
                return None
        try:
            found = _snapfiles.upper_names(upper)
        finally:
            os.close(upper)
        return None if found is None else frozenset(found)

    def layer_descriptors(self) -> tuple[int, list[int]] | None:
        """Copies of the upper layer's folder and of the lower layers' descriptors (top
        first), the caller's to close; None once closed."""
        with self._upper_lock:
            if self._upper < 0:
                return None
            taken: list[int] = []
            try:
                for fd in (self._upper, *self._sources):
                    taken.append(os.dup(fd))
            except OSError:
                for fd in taken:
                    os.close(fd)
                raise
        return taken[0], taken[1:]

    def close(self) -> None:
        """Unmount the frame with every layer in it, and remove its folder. Idempotent."""
        with self._upper_lock:
            upper, self._upper = self._upper, -1
            sources, self._sources = self._sources, []
        for fd in (upper, *sources):
            if fd >= 0:
                os.close(fd)  # else the detached tmpfs would live on through it
        with contextlib.suppress(FileNotFoundError):
            _unmount_frame(self.frame)


def _bound(lower: str | tuple[str, ...], tree: str) -> int:
    """Bind ``lower`` at ``tree``, or each layer of a stack at ``tree``'s ``0``, ``1``...
    (as ``overlay_workspace(layers=)`` reads them); how many layers (0: one tree)."""
    if isinstance(lower, str):
        _sys.mount(lower, tree, None, _sys.MS_BIND)
        return 0
    if not 0 < len(lower) <= _lowerfs.MAX_LAYERS:
        raise OSError(f"a stack holds 1 to {_lowerfs.MAX_LAYERS} layers, not {len(lower)}")
    for index, layer in enumerate(lower):
        folder = os.path.join(tree, str(index))
        os.mkdir(folder, 0o755)
        _sys.mount(layer, folder, None, _sys.MS_BIND)
    return len(lower)


def _overlay(workspace: str, tree: str, uid: int, gid: int, layers: int) -> list[int]:
    """``overlay_workspace`` in a single-threaded child; the lower layers it took (``O_PATH``
    descriptors, top first, sent back over a socket pair); ``OSError`` with its last words."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        argv = [sys.executable, "-I", "-S", "-c", _LAY, _SERVER_PARENT, workspace, tree]
        done = subprocess.run(
            [*argv, str(uid), str(gid), str(layers), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        theirs.close()
        if done.returncode != 0:
            words = (done.stderr.strip().splitlines() or ["no words"])[-1]
            raise OSError(f"the workspace's overlay cannot be laid: {words}")
        _, sources, _, _ = socket.recv_fds(ours, 1, _lowerfs.MAX_LAYERS)
    return sources

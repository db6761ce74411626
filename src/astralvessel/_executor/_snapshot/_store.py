"""Where snapshots live on the host: one private folder per process, a tree per snapshot.

A snapshot's tree is made by ``extract_archive`` (the checked reader, for a
sandbox's files as for a saved file) in a fresh folder under the process's
store, and removed (by ``_reaper``'s thread, not the caller's) when the last
``TurnSnapshot`` holding it is collected. An executor's snapshots count against
its budget (``Executor(snapshot_budget_mb=)``) until then, each file once however
many trees hard-link it; a snapshot loaded from a file counts against none.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import tempfile
import threading
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ..._ground import _mounts
from ..._ground._leftovers import make_folder
from ..._ground._removal import remove_folder
from ...errors import SnapshotError
from ._reaper import enqueue

__all__ = ["Budget", "Inodes", "Reservation", "Tree", "new_folder", "store_root"]

MIB = 1 << 20

_lock = threading.Lock()
_root: str | None = None


def store_root() -> str:
    """The process's store folder, made on first need."""
    global _root  # noqa: PLW0603 - one store per process, made on first need
    with _lock:
        if _root is None:
            # Named for this process: a host that died leaves its trees to the next one's sweep.
            _root = make_folder("snapshots")
        return _root


def new_folder() -> Path:
    """A fresh private folder in the store, for one tree or one spooled archive."""
    return Path(tempfile.mkdtemp(dir=store_root()))


_private = False


def _private_store() -> None:
    """Make the store a private mount, once, where a mount in it would propagate
    (``_ground._mounts``: no layer staged in it reaches the host's peers and slaves).
    Where it cannot be, a layer is staged all the same."""
    global _private  # noqa: PLW0603 - one store per process
    root = store_root()
    with _lock:
        if not _private and _mounts.propagates(root):
            with contextlib.suppress(OSError):
                _mounts.make_private(root)
                # At exit, the store's mount goes with what is staged under it (the
                # reaper then removes plain folders); not in a forked child's exit.
                atexit.register(_unmount_store, root, os.getpid())
        _private = True


def _unmount_store(root: str, owner: int) -> None:
    if os.getpid() == owner:
        _mounts.unmount(root)


def mount_stack(layers: tuple[Path, ...], *, userxattr: bool) -> Path:
    """Mount the read-only overlay of the staged ``layers`` (top first, no upper layer) on
    ``tree`` in a fresh store folder; return that path: the merged view of a stack of
    frozen layers, read as any tree (a fork's snapshot, ``Tree.stacked``).

    ``userxattr``: the layers' whiteouts and opaque folders are ``user.overlay.*`` ones
    (the fork's overlay was mounted so), else ``trusted.overlay.*``. Redirects and
    metacopy are neither followed nor made, as in the sandboxes' own overlays: a name
    is what its layers hold at that name, never a path an attribute names.
    """
    if len(layers) < 2:
        raise OSError(errno.EINVAL, "a stack of layers holds two at least")
    texts = [str(layer) for layer in layers]
    if any(char in text for text in texts for char in ":,\\"):
        why = "a staged layer's path holds a character the overlay's options split on"
        raise OSError(errno.EINVAL, why)
    _private_store()
    folder = new_folder()
    path = folder / "tree"
    mode = ",userxattr" if userxattr else ""
    options = f"lowerdir={':'.join(texts)},redirect_dir=nofollow,metacopy=off{mode}"
    try:
        path.mkdir()
        _mounts.mount_overlay(str(path), options)
    except BaseException:
        remove_folder(folder)
        raise
    return path


def stage_layer(fd: int) -> Path:
    """Move the frozen layer whose detached mount ``fd`` is onto ``tree`` in a fresh store
    folder (``_ground._mounts``); return that path. The caller closes ``fd``."""
    _private_store()
    folder = new_folder()
    path = folder / "tree"
    try:
        path.mkdir()
        _mounts.stage(fd, str(path))
    except BaseException:
        remove_folder(folder)
        raise
    return path


#: The regular files a tree holds: (st_dev, st_ino) to the bytes each counts (its size, a
#: sparse file's holes included, as a manifest counts them).
Inodes = dict[tuple[int, int], int]


class Reservation:
    """Bytes a capture holds on a budget from its estimate until its tree is counted
    exactly (``Budget.hold``) or the capture ends (``Budget.cancel``)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.open = True


class Budget:
    """An executor's bytes of snapshots, each file counted once however many trees hold it.

    Incremental snapshots hard-link the files an older tree holds, so a file
    is counted per inode, with a count of the live trees holding it: its bytes
    are taken by the first and given back when the last one goes. A capture
    reserves its estimate first (``reserve``), so two captures at once cannot
    both pass it for the same room: the reservation counts until the capture's
    tree is counted exactly (``hold``) or the capture ends (``cancel``).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._used = 0
        self._pending = 0  # the open reservations' bytes
        self._held: dict[tuple[int, int], tuple[int, int]] = {}  # inode: (trees, bytes)
        self._lock = threading.Lock()
        _BUDGETS.add(self)

    @property
    def used_bytes(self) -> int:
        """The distinct bytes of this executor's snapshots still alive."""
        return self._used

    @property
    def reserved_bytes(self) -> int:
        """The bytes captures under way have reserved and not yet counted exactly."""
        return self._pending

    def reserve(self, nbytes: int) -> Reservation:
        """Hold ``nbytes`` for a capture (its estimate, before it reads a file, so a refusal
        costs nothing), or raise ``SnapshotError`` when they would not fit beside the trees
        alive and the other captures' reservations."""
        with self._lock:
            if self._used + self._pending + nbytes > self.limit_bytes:
                raise self._refusal(nbytes)
            self._pending += nbytes
            return Reservation(nbytes)

    def cancel(self, reservation: Reservation) -> None:
        """Give a reservation's bytes back (its capture ended); once, however often called."""
        with self._lock:
            self._close(reservation)

    def hold(
        self,
        inodes: Inodes,
        reservation: Reservation | None = None,
        record: Inodes | None = None,
    ) -> None:
        """Count a new tree's files (those no live tree holds yet add their bytes) in place
        of ``reservation``, and add them to ``record`` (the tree's own), in one step; or
        raise ``SnapshotError`` when they do not fit, counting nothing (the reservation is
        closed either way: its capture is done)."""
        with self._lock:
            if reservation is not None:
                self._close(reservation)
            fresh = sum(size for key, size in inodes.items() if key not in self._held)
            if self._used + self._pending + fresh > self.limit_bytes:
                raise self._refusal(fresh)
            for key, size in inodes.items():
                trees, _ = self._held.get(key, (0, size))
                self._held[key] = (trees + 1, size)
            self._used += fresh
            if record is not None:
                record.update(inodes)

    def release(self, inodes: Inodes) -> None:
        """A tree holding ``inodes`` goes: a file no other tree holds gives its bytes back.
        ``inodes`` is emptied as it is read, so a second release gives nothing twice."""
        with self._lock:
            for key in list(inodes):
                trees, size = self._held.pop(key, (1, 0))
                if trees > 1:
                    self._held[key] = (trees - 1, size)
                else:
                    self._used -= size
            inodes.clear()

    def _close(self, reservation: Reservation) -> None:
        if reservation.open:
            reservation.open = False
            self._pending -= reservation.nbytes

    def _after_fork_in_child(self) -> None:
        # A thread of the parent may have held the lock at the fork: the child has no such
        # thread, and would wait for it for good.
        self._lock = threading.Lock()

    def _refusal(self, nbytes: int) -> SnapshotError:
        return SnapshotError(
            f"the snapshot holds {_mib(nbytes)} and the executor's snapshots "
            f"already {_mib(self._used + self._pending)} of its budget of "
            f"{_mib(self.limit_bytes)} (Executor(snapshot_budget_mb=...)); "
            "drop older snapshots or raise it"
        )


#: Every budget of the process, so a forked child can give each a fresh lock.
_BUDGETS: weakref.WeakSet[Budget] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _lock  # noqa: PLW0603 - the parent's lock may have been held by one of its threads
    _lock = threading.Lock()
    for budget in list(_BUDGETS):
        budget._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.1f} MiB"


class Tree:
    """A snapshot's files in the store; the folder goes when this object is collected.

    Or a frozen layer (``Tree.frozen``): a sandbox's workspace tmpfs, made read-only in
    place and mounted at ``tree`` in a fresh store folder; when this object is collected
    it is unmounted (the kernel frees the tmpfs with its last mount) and the folder goes.
    """

    def __init__(
        self,
        path: Path,
        budget: Budget | None,
        *,
        mounted: bool = False,
        held: int | None = None,
        layers: tuple[Tree, ...] = (),
    ) -> None:
        self.path = path
        #: The frozen layers a stacked tree's merged view lies on, top first
        #: (``Tree.stacked``); empty for any other tree. Kept while this tree is.
        self.layers = layers
        #: Whether ``path`` is a frozen layer's mount (``Tree.frozen``, ``Tree.held``), not
        #: a folder's files.
        self.mounted = mounted or held is not None
        #: The frozen layer's descriptor this process holds (``Tree.held``), or None.
        self.held = held
        self._budget = budget
        self._inodes: Inodes = {}
        self._lock = threading.Lock()  # hold and remove, one at a time
        #: A frozen layer's copy in the store, for links (``_freeze.store_copy``): made
        #: once, under ``copy_lock``, the first time a capture would link from the layer.
        self.copy: Tree | None = None
        self.copy_lock = threading.Lock()
        #: Where this process cannot read a held tree's files (an ordinary user's Docker
        #: layer or stack: the turn's uid's), what reads them for it: ``read(held)``, the
        #: backend's reader's session (``docker._reader``: ``contents``); else None.
        self.reader: Callable[[int], AbstractContextManager[Any]] | None = None
        self._finalizer = weakref.finalize(
            self, _drop, path.parent, budget, self._inodes, os.getpid(),
            path if mounted else None, held=held, layers=layers,
        )  # fmt: skip

    @classmethod
    def frozen(cls, fd: int, budget: Budget | None) -> Tree:
        """The tree of a frozen layer whose detached mount (open_tree's clone) ``fd`` is.

        The mount is moved onto ``tree`` in a fresh store folder (``stage_layer``) and
        ``fd`` closed (here, whatever happens): from then on the layer is an ordinary
        path, read as any tree in the store is (a turn opened from it binds it; saving,
        restoring by copy read it), and unmounted, then its folder removed, when this
        object goes. Root only (``_freeze.freezes_here``): raises ``OSError`` where the
        mount cannot be moved.
        """
        try:
            path = stage_layer(fd)
        finally:
            os.close(fd)
        return cls(path, budget, mounted=True)

    @classmethod
    def stacked(cls, layers: tuple[Tree, ...], budget: Budget | None, *, userxattr: bool) -> Tree:
        """The tree of a stack of staged frozen layers (``layers``, top first: a fork's own
        upper layer over those its overlay lay on), mounted as their merged read-only
        overlay (``mount_stack``) in a fresh store folder. The layers (and their bytes on
        the budget, each layer's own) are kept until this object goes; its own files are
        theirs, so it holds none. Root only: raises ``OSError`` where it cannot mount."""
        path = mount_stack(tuple(layer.path for layer in layers), userxattr=userxattr)
        return cls(path, budget, mounted=True, layers=layers)

    @property
    def stack(self) -> tuple[Tree, ...]:
        """The staged frozen layers this tree's files are, top first: a stacked tree's
        layers, a staged layer itself alone; empty for a store tree or a held layer."""
        if self.held is not None:
            return ()
        if self.layers:
            return self.layers
        return (self,) if self.mounted else ()

    @classmethod
    def held_stacked(cls, fd: int, layers: tuple[Tree, ...], budget: Budget | None) -> Tree:
        """The tree of a stack of held frozen layers (``layers``, top first: an ordinary
        user's fork's own layer over those its overlay lay on), whose merged read-only
        overlay ``fd`` is (``_heldmerge.merged_view``, a detached mount): read through
        ``/proc/self/fd`` as a held layer is, and closed when this object goes; the
        layers are kept until then. Its own files are theirs, so it holds none."""
        return cls(Path(f"/proc/self/fd/{fd}"), budget, held=fd, layers=layers)

    @property
    def held_stack(self) -> tuple[Tree, ...]:
        """The held frozen layers this tree's files are, top first (an ordinary user's):
        a held stack's layers, a held layer itself alone; empty for any other tree."""
        if self.held is None:
            return ()
        return self.layers or (self,)

    @classmethod
    def held_layer(cls, fd: int, budget: Budget | None) -> Tree:
        """The tree of a frozen layer whose detached mount ``fd`` this process keeps: an
        ordinary user's host, which cannot mount it at a path of its store.

        The host reads it as any tree through ``/proc/self/fd/N`` (its own reads only:
        no launcher binds such a path, ``sandbox._layout``); a fork's launcher passes
        the descriptor itself to its server (``Policy.workspace_lower_fd``). ``fd`` is
        the tree's from here on, closed when this object goes (close-on-exec till then,
        so no process the host starts inherits it but a launcher it passes it to).
        """
        return cls(Path(f"/proc/self/fd/{fd}"), budget, held=fd)

    @property
    def budget(self) -> Budget | None:
        """The budget the tree's files count on (None: a loaded snapshot's)."""
        return self._budget

    def hold(self, inodes: Inodes, reservation: Reservation | None = None) -> None:
        """Count the tree's files against its budget in place of ``reservation`` (the
        capture's estimate); ``SnapshotError`` if they do not fit, or the tree is gone."""
        if self._budget is None:
            return
        with self._lock:
            if not self._finalizer.alive:
                raise SnapshotError("the snapshot's tree was removed while it was counted")
            # The budget and the tree's record of its inodes change in one step, so the
            # bytes a tree holds are exactly those its removal gives back.
            self._budget.hold(inodes, reservation, record=self._inodes)

    def remove(self) -> None:
        """Queue the folder's removal now (its bytes go back as it is removed)."""
        with self._lock:
            self._finalizer()


def _drop(
    folder: Path,
    budget: Budget | None,
    inodes: Inodes,
    owner: int,
    mount: Path | None = None,
    *,
    held: int | None = None,
    layers: tuple[Tree, ...] = (),
) -> None:
    # ``layers`` (a stacked tree's) are let go with this call: each is removed once no
    # other stack or snapshot keeps it, after its overlay here is queued for unmounting.
    del layers
    if held is not None:
        _close_held(held, budget, inodes, owner)
        return
    # The bytes go back when the reaper removes the tree, just before its files go, not
    # when it is queued: the budget bounds the store's disk, and an inode number is never
    # counted after its file is gone (a new file could reuse it). A frozen layer's mount
    # (``mount``) is unmounted first, by the reaper too (a last unmount frees its tmpfs).
    release = functools.partial(budget.release, inodes) if budget is not None else None
    enqueue(folder, release, owner, unmount=mount)


def _close_held(fd: int, budget: Budget | None, inodes: Inodes, owner: int) -> None:
    # A held layer has no folder: its bytes go back and its descriptor is closed (the
    # kernel frees the tmpfs with its last mount: the forks' clones keep it till they
    # end). Not in a child forked from the host, whose copy is not the tree.
    if os.getpid() != owner:
        return
    try:
        if budget is not None:
            budget.release(inodes)
    finally:
        os.close(fd)

"""Where snapshots live on the host: one private folder per process, a tree per snapshot.

A snapshot's tree is made by ``extract_archive`` (the checked reader, for a
sandbox's files as for a saved file) in a fresh folder under the process's
store, and removed (by ``_reaper``'s thread, not the caller's) when the last
``TurnSnapshot`` holding it is collected. An executor's snapshots count against
its budget (``Executor(snapshot_budget_mb=)``) until then, each file once however
many trees hard-link it; a snapshot loaded from a file counts against none.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import weakref
from pathlib import Path

from ..._ground._leftovers import make_folder
from ...errors import SnapshotError
from ._reaper import enqueue

__all__ = ["Budget", "Inodes", "Tree", "new_folder", "store_root"]

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


#: The regular files a tree holds: (st_dev, st_ino) to the bytes each counts (its size, a
#: sparse file's holes included, as a manifest counts them).
Inodes = dict[tuple[int, int], int]


class Budget:
    """An executor's bytes of snapshots, each file counted once however many trees hold it.

    Incremental snapshots hard-link the files an older tree holds, so a file
    is counted per inode, with a count of the live trees holding it: its bytes
    are taken by the first and given back when the last one goes.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._used = 0
        self._held: dict[tuple[int, int], tuple[int, int]] = {}  # inode: (trees, bytes)
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        """The distinct bytes of this executor's snapshots still alive."""
        return self._used

    def check(self, nbytes: int) -> None:
        """``SnapshotError`` if ``nbytes`` more would not fit (a capture's estimate, before it
        reads a file, so a refusal costs nothing); nothing is taken."""
        with self._lock:
            if self._used + nbytes > self.limit_bytes:
                raise self._refusal(nbytes)

    def hold(self, inodes: Inodes) -> None:
        """Count a new tree's files (those no live tree holds yet add their bytes), or raise
        ``SnapshotError`` when they do not fit, counting nothing."""
        with self._lock:
            fresh = sum(size for key, size in inodes.items() if key not in self._held)
            if self._used + fresh > self.limit_bytes:
                raise self._refusal(fresh)
            for key, size in inodes.items():
                trees, _ = self._held.get(key, (0, size))
                self._held[key] = (trees + 1, size)
            self._used += fresh

    def release(self, inodes: Inodes) -> None:
        """A tree holding ``inodes`` goes: a file no other tree holds gives its bytes back."""
        with self._lock:
            for key in inodes:
                trees, size = self._held.pop(key, (1, 0))
                if trees > 1:
                    self._held[key] = (trees - 1, size)
                else:
                    self._used -= size

    def _refusal(self, nbytes: int) -> SnapshotError:
        return SnapshotError(
            f"the snapshot holds {_mib(nbytes)} and the executor's snapshots "
            f"already {_mib(self._used)} of its budget of {_mib(self.limit_bytes)} "
            "(Executor(snapshot_budget_mb=...)); drop older snapshots or raise it"
        )


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.1f} MiB"


class Tree:
    """A snapshot's files in the store; the folder goes when this object is collected."""

    def __init__(self, path: Path, budget: Budget | None) -> None:
        self.path = path
        self._budget = budget
        self._inodes: Inodes = {}
        self._finalizer = weakref.finalize(
            self, _drop, path.parent, budget, self._inodes, os.getpid()
        )

    def hold(self, inodes: Inodes) -> None:
        """Count the tree's files against its budget (``SnapshotError`` if they do not fit)."""
        if self._budget is not None:
            self._budget.hold(inodes)
            self._inodes.update(inodes)

    def remove(self) -> None:
        """Queue the folder's removal now (its bytes go back as it is removed)."""
        self._finalizer()


def _drop(folder: Path, budget: Budget | None, inodes: Inodes, owner: int) -> None:
    # The bytes go back when the reaper removes the tree, just before its files go, not
    # when it is queued: the budget bounds the store's disk, and an inode number is never
    # counted after its file is gone (a new file could reuse it).
    release = functools.partial(budget.release, inodes) if budget is not None and inodes else None
    enqueue(folder, release, owner)

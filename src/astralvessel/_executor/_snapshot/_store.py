"""Where snapshots live on the host: one private folder per process, a tree per snapshot.

A snapshot's tree is made by ``extract_archive`` (the checked reader, for a
sandbox's files as for a saved file) in a fresh folder under the process's
store, and removed when the last ``TurnSnapshot`` holding it is collected. An
executor's snapshots count against its budget (``Executor(snapshot_budget_mb=)``)
until then; a snapshot loaded from a file counts against none.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

from ..._ground._leftovers import make_folder
from ...errors import SnapshotError

__all__ = ["Budget", "Tree", "new_folder"]

MIB = 1 << 20

_lock = threading.Lock()
_root: str | None = None


def _store_root() -> str:
    global _root  # noqa: PLW0603 - one store per process, made on first need
    with _lock:
        if _root is None:
            # Named for this process: a host that died leaves its trees to the next one's sweep.
            _root = make_folder("snapshots")
        return _root


def new_folder() -> Path:
    """A fresh private folder in the store, for one tree or one spooled archive."""
    return Path(tempfile.mkdtemp(dir=_store_root()))


class Budget:
    """An executor's bytes of snapshots: taken on capture, given back when a tree goes."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        """The bytes of this executor's snapshots still alive."""
        return self._used

    def take(self, nbytes: int) -> None:
        """Count ``nbytes`` more, or raise ``SnapshotError`` when they do not fit."""
        with self._lock:
            if self._used + nbytes > self.limit_bytes:
                raise SnapshotError(
                    f"the snapshot holds {_mib(nbytes)} and the executor's snapshots "
                    f"already {_mib(self._used)} of its budget of {_mib(self.limit_bytes)} "
                    "(Executor(snapshot_budget_mb=...)); drop older snapshots or raise it"
                )
            self._used += nbytes

    def give_back(self, nbytes: int) -> None:
        """Count ``nbytes`` fewer (a tree was removed)."""
        with self._lock:
            self._used -= nbytes


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:.1f} MiB"


class Tree:
    """A snapshot's files in the store; the folder goes when this object is collected."""

    def __init__(self, path: Path, nbytes: int, budget: Budget | None) -> None:
        self.path = path
        self._finalizer = weakref.finalize(self, _remove, path, nbytes, budget, os.getpid())

    def remove(self) -> None:
        """Remove the folder now (and give its bytes back)."""
        self._finalizer()


def _remove(path: Path, nbytes: int, budget: Budget | None, owner: int) -> None:
    # A child forked from the host holds copies of its snapshots, not the trees: its exit
    # (which runs finalizers) must leave them to the process that made them.
    if os.getpid() != owner:
        return
    shutil.rmtree(path.parent, ignore_errors=True)
    if budget is not None:
        budget.give_back(nbytes)

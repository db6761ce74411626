"""A turn's temporary outbox folder on the host: kept while a result names a file in it.

Without a host folder for them (``Policy.outbox_dir``), a turn copies its calls'
outbox files into a temporary folder of its own. The files belong to the
results that name them, which the host may read after the turn ends (an
adapter attaching an image to the model's next request). So the folder goes
once the turn is closed *and* no ``OutboxFile`` naming one of its files is
alive any more, or at the process's exit: a host running hundreds of turns
keeps the folders of the results it still holds, not one per turn it ran. A
host killed outright runs neither; its folders are named for its process
(``_leftovers``), and the next process to make one removes them.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import weakref
from pathlib import Path

from .._ground._leftovers import make_folder
from ._api import OutboxFile

__all__ = ["TemporaryOutbox", "TurnOutbox"]


class TemporaryOutbox:
    """One turn's temporary folder of outbox files (``kind`` names it: ``bubblewrap-outbox``).

    Raises ``OSError`` as ``tempfile.mkdtemp`` does when the folder cannot be made.
    """

    def __init__(self, kind: str) -> None:
        self.path = Path(make_folder(kind))
        # A lock, not an RLock: nothing inside it drops an OutboxFile, so no finalizer runs there.
        self._lock = threading.Lock()
        self._named = 0
        self._closed = False
        # Removes the folder once (finalize calls its function at most once): at the last
        # release, when this object is collected, or at exit. rmtree never follows a link.
        self._remove = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)

    def keep_for(self, file: OutboxFile) -> OutboxFile:
        """Keep the folder at least as long as ``file`` lives; return ``file``."""
        with self._lock:
            self._named += 1
        # The finalizer holds this object too, so it outlives every file it tracks.
        released = weakref.finalize(file, self._release)
        # At exit ``_remove`` takes the whole folder: no need to count down the files first.
        released.atexit = False
        return file

    def close(self) -> None:
        """The turn ended: remove the folder now, or when the last file naming it goes."""
        with self._lock:
            self._closed = True
            unused = self._named == 0
        if unused:
            self._remove()

    def _release(self) -> None:
        with self._lock:
            self._named -= 1
            unused = self._closed and self._named == 0
        if unused:
            self._remove()


class TurnOutbox:
    """One turn's host folder of outbox files, made at the first call that needs it: a folder
    of its own under the host's ``outbox_dir`` (kept for the host), else a ``TemporaryOutbox``
    named ``kind``. Every session (the server's, docker-exec's, Ray's, the testing fake's)
    keeps its files through one.
    """

    def __init__(self, host: Path | None, kind: str) -> None:
        self._host = host
        self._kind = kind
        self._lock = threading.Lock()
        self._root: Path | None = None
        #: The temporary folder, once made (None under a host folder, or before the first use).
        self.temporary: TemporaryOutbox | None = None

    def root(self) -> Path:
        """The turn's folder, made now if this is its first use.

        Raises ``OSError`` as ``tempfile.mkdtemp`` does when it cannot be made.
        """
        with self._lock:
            if self._root is None:
                if self._host is None:
                    self.temporary = TemporaryOutbox(self._kind)
                    self._root = self.temporary.path
                else:
                    self._host.mkdir(parents=True, exist_ok=True)
                    self._root = Path(tempfile.mkdtemp(prefix="turn-", dir=self._host))
            return self._root

    def adopt(self, file: OutboxFile) -> OutboxFile:
        """``file``, which now keeps a temporary folder alive as long as it lives."""
        temporary = self.temporary
        return file if temporary is None else temporary.keep_for(file)

    def close(self) -> None:
        """The turn ended: a temporary folder goes now, or with the last file naming it."""
        if self.temporary is not None:
            self.temporary.close()

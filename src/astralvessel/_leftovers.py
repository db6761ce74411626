"""Temporary folders named for the process that owns them, so a killed owner's are found.

A host process removes its temporary folders (a turn's outbox, the egress
proxy's socket folder) when it closes them, or at exit. A process killed with
SIGKILL does neither, and an eval worker is often ended that way (Ray kills its
actors): each such death left its folders in the temporary folder for good (a
few hundred after a day of CI). So each folder's name says whose it is,
``astralvessel-<kind>-<pid>-<start time>-<random>``, and the first folder of a
kind a process makes removes that kind's folders whose owner is gone: no such
pid, or a pid reused by a process started at another time. Only real folders
of this uid are removed, never through a link.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["is_leftover", "make_folder", "owned_prefix", "remove_leftovers", "start_time"]


def start_time(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot), or ``None`` if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields resume after the last ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def _kind_prefix(kind: str) -> str:
    return f"astralvessel-{kind}-"


def owned_prefix(kind: str) -> str:
    """The start of this process's folder names of ``kind``; without ``/proc`` (no owner can
    be told dead there) a name that is never taken for a leftover."""
    pid = os.getpid()
    started = start_time(pid)
    return _kind_prefix(kind) + ("" if started is None else f"{pid}-{started}-")


def is_leftover(name: str, kind: str, start_time_of: Callable[[int], str | None]) -> bool:
    """Whether ``name`` is a folder of ``kind`` whose owner process is gone."""
    prefix = _kind_prefix(kind)
    if not name.startswith(prefix):
        return False
    pid, _, rest = name[len(prefix) :].partition("-")
    started, sep, _ = rest.partition("-")
    if not (pid.isdigit() and started.isdigit() and sep):
        return False
    return start_time_of(int(pid)) != started


def remove_leftovers(kind: str, parent: str | None = None) -> int:
    """Remove the folders of ``kind`` in ``parent`` whose owner is gone; return how many."""
    parent = parent or tempfile.gettempdir()
    removed = 0
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if not is_leftover(entry.name, kind, start_time):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False) and (
                    entry.stat(follow_symlinks=False).st_uid == os.geteuid()
                ):
                    # rmtree checks the folder it opens is the one it looked at: never a link.
                    shutil.rmtree(entry.path)
                    removed += 1
    return removed


@functools.cache
def _removed_once(kind: str, parent: str) -> None:
    """At a process's first folder of a kind only: the dead's folders do not come back.

    (Two first folders at once may both look: a folder is removed once, harmlessly.)
    """
    remove_leftovers(kind, parent)


def make_folder(kind: str) -> str:
    """Make a private temporary folder of ``kind`` named for this process; return its path.

    The first call for a kind (per temporary folder) removes the leftovers of
    owners that are gone. Raises ``OSError`` as ``tempfile.mkdtemp`` does.
    """
    parent = tempfile.gettempdir()
    _removed_once(kind, parent)
    return tempfile.mkdtemp(prefix=owned_prefix(kind), dir=parent)

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

A folder that holds a unix socket may be named compactly instead, so that its
socket's path fits a socket's address (107 bytes) more often and is bound
directly, not through ``/proc`` (``_unixsock``): the pid and start time in
base 36, each followed by a dot (``astralvessel-egress-2hwcg.cuyo00.<random>``),
5 characters shorter for a large pid on a host up for months. The dots tell
the forms apart: a decimal name is never read as base 36, which could take a
live owner's folder (of an older version of this library) for a dead one's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ._mounts import unmount_under
from ._removal import remove_folder

__all__ = [
    "is_leftover",
    "leftover_folders",
    "make_folder",
    "owned_prefix",
    "remove_leftovers",
    "start_time",
]


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


def owned_prefix(kind: str, *, compact: bool = False) -> str:
    """The start of this process's folder names of ``kind`` (``compact``: in base 36); without
    ``/proc`` (no owner can be told dead there) a name that is never taken for a leftover."""
    pid = os.getpid()
    started = start_time(pid)
    if started is None:
        return _kind_prefix(kind)
    if compact:
        return f"{_kind_prefix(kind)}{_base36(pid)}.{_base36(int(started))}."
    return f"{_kind_prefix(kind)}{pid}-{started}-"


_DIGITS36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(number: int) -> str:
    digits = ""
    while True:
        number, digit = divmod(number, 36)
        digits = _DIGITS36[digit] + digits
        if not number:
            return digits


def _is_base36(text: str) -> bool:
    # Not int(text, 36) alone: it takes upper case, underscores and spaces too.
    return bool(text) and all(c in _DIGITS36 for c in text)


def _owner(tail: str) -> tuple[int, str] | None:
    """The pid and start time a folder name's tail names (either form), or None."""
    pid, sep, rest = tail.partition("-")
    started, sep2, _ = rest.partition("-")
    if sep and sep2 and pid.isdigit() and started.isdigit():
        return int(pid), started
    pid, sep, rest = tail.partition(".")
    started, sep2, _ = rest.partition(".")
    if sep and sep2 and _is_base36(pid) and _is_base36(started):
        return int(pid, 36), str(int(started, 36))
    return None


def is_leftover(name: str, kind: str, start_time_of: Callable[[int], str | None]) -> bool:
    """Whether ``name`` is a folder of ``kind`` whose owner process is gone."""
    prefix = _kind_prefix(kind)
    if not name.startswith(prefix):
        return False
    owner = _owner(name[len(prefix) :])
    if owner is None:
        return False
    pid, started = owner
    return start_time_of(pid) != started


def leftover_folders(
    kind: str,
    parent: str | None = None,
    start_time_of: Callable[[int], str | None] = start_time,
) -> list[os.DirEntry[str]]:
    """The folders of ``kind`` in ``parent`` whose owner is gone: real folders of this uid only.

    ``parent`` defaults to the temporary folder; what cannot be read is passed over.
    """
    folders: list[os.DirEntry[str]] = []
    with contextlib.suppress(OSError), os.scandir(parent or tempfile.gettempdir()) as entries:
        for entry in entries:
            if not is_leftover(entry.name, kind, start_time_of):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False) and (
                    entry.stat(follow_symlinks=False).st_uid == os.geteuid()
                ):
                    folders.append(entry)
    return folders


def remove_leftovers(kind: str, parent: str | None = None) -> int:
    """Remove the folders of ``kind`` in ``parent`` whose owner is gone; return how many."""
    removed = 0
    for entry in leftover_folders(kind, parent):
        # A dead root host's store may hold mounts (its frozen layers staged there, the
        # store made a private mount of its own: ``_mounts``): detached first, or the
        # removal would stop at each (a read-only tmpfs, or EBUSY).
        unmount_under(entry.path)
        # rmtree (under remove_folder) checks the folder it opens is the one it looked at:
        # never a link. A dead host's snapshot tree may hold folders of mode 0555.
        remove_folder(Path(entry.path))
        removed += not os.path.lexists(entry.path)
    return removed


@functools.cache
def _removed_once(kind: str, parent: str) -> None:
    """At a process's first folder of a kind only: the dead's folders do not come back.

    (Two first folders at once may both look: a folder is removed once, harmlessly.)
    """
    remove_leftovers(kind, parent)


def make_folder(kind: str, *, compact: bool = False) -> str:
    """Make a private temporary folder of ``kind`` named for this process; return its path.

    ``compact`` names the owner in base 36 (for a folder holding a socket). The
    first call for a kind (per temporary folder) removes the leftovers of owners
    that are gone, named either way. Raises ``OSError`` as ``tempfile.mkdtemp`` does.
    """
    parent = tempfile.gettempdir()
    _removed_once(kind, parent)
    return tempfile.mkdtemp(prefix=owned_prefix(kind, compact=compact), dir=parent)

"""Each call's outbox in the sandbox server: made before the call, emptied after it (stdlib, 3.8+).

A call's ``$VESSEL_OUTBOX`` is its own folder, ``<outbox>/<call id>``, so calls
of one turn that run at once never take each other's files. When the call has
ended (every process it started is gone), the server takes what it left there
and removes the folder. Whatever the call left, this must not break the server,
so every step is bounded and none recurses:

- at most ``FILES_PER_CALL`` files come back (the first by name), and at most
  the disk limit in bytes;
- only plain files with one link owned by the call's user, opened without
  following a link (so neither kind of link can pull in a file the call could
  not read itself);
- only names that are valid UTF-8 (a name the host could not write or show);
- the folder is removed one directory at a time, holding one descriptor, so
  any depth of nesting and any number of entries are removed without recursion.

What is not returned is counted by reason, for a note the model sees. A
folder the call removed, swapped for a link or made unreadable to the server
returns nothing, and the note says why (``Collected.unlisted``): the folder
exists from the call's start, so an outbox that is gone is the call's doing,
never an outbox that looks empty.
"""

from __future__ import annotations

import errno
import heapq
import os
import stat

from ._lean import suppress

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "FILES_PER_CALL",
    "Collected",
    "collect",
    "open_root",
    "prepare",
    "remove_tree",
    "send_files",
]

#: The most files one call's outbox returns; the rest are counted, not returned.
FILES_PER_CALL = 100
#: The most entries one cleanup removes (a call could leave millions of empty files).
REMOVE_BUDGET = 200_000
#: Bytes per ``file`` frame.
FILE_CHUNK = 1 << 20

# Why an entry was not returned, as the ``exit`` frame's ``skipped`` names it: a reason,
# not words (the host's ``results`` words the note the model reads).
#: Not a plain file of the call's own: a folder, a link or a special file.
NOT_PLAIN = "not_plain"
#: A name that is not UTF-8.
NOT_UTF8 = "not_utf8"
#: Past ``FILES_PER_CALL`` files.
TOO_MANY = "too_many"
#: Past the disk limit in total.
TOO_BIG = "too_big"


class Collected:
    """The files taken from one call's outbox, open, and what was left behind by reason."""

    def __init__(self) -> None:
        #: ``(name, fd, size)`` in name order.
        self.files: list[tuple[str, int, int]] = []
        self.skipped: dict[str, int] = {}
        #: Why the folder could not be listed (its path and the OS's words), if it could not.
        self.unlisted = ""

    def cannot_list(self, path: str, error: OSError) -> None:
        self.unlisted = f"'{path}': {error.strerror or error}"

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def close(self) -> None:
        for _, fd, _ in self.files:
            with suppress(OSError):
                os.close(fd)
        self.files = []


def prepare(root: str, call_id: int, uid: int | None, gid: int | None) -> str:
    """Make the call's empty outbox folder, owned by the call's user; return its path.

    Every step holds a descriptor opened without following a link: an earlier
    call may have swapped ``root`` for a link, and the server (root on a root
    host) must not make, nor hand to the call's user, a folder where the link
    points (inside a root-owned folder of a writable mount, say).
    """
    name = str(call_id)
    rfd = open_root(root, uid, gid)
    try:
        try:
            os.mkdir(name, 0o755, dir_fd=rfd)
        except FileExistsError:
            remove_tree(rfd, name)
            os.mkdir(name, 0o755, dir_fd=rfd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=rfd)
    finally:
        os.close(rfd)
    os.close(_handed_over(fd, uid, gid))
    return os.path.join(root, name)


#: A folder opened to work inside it, never through a link at its last name.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def open_root(root: str, uid: int | None, gid: int | None) -> int:
    """Open the outbox folder ``root``, first making it again (the call's user's) if a call
    removed it or left a link or a file in its place."""
    try:
        return os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        pass
    except OSError as exc:
        # ELOOP (a link) or ENOTDIR (a file): the call's doing. Its parent (the workspace) is
        # a mount point or a host folder, so only the last name can have been swapped.
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        parent, name = os.path.split(root)
        pfd = os.open(parent, _DIR_FLAGS)
        try:
            remove_tree(pfd, name)
        finally:
            os.close(pfd)
    parent, name = os.path.split(root)
    pfd = os.open(parent, _DIR_FLAGS)
    try:
        with suppress(FileExistsError):  # made meanwhile by a call of the turn
            os.mkdir(name, 0o755, dir_fd=pfd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=pfd)
    finally:
        os.close(pfd)
    return _handed_over(fd, uid, gid)


def _handed_over(fd: int, uid: int | None, gid: int | None) -> int:
    """Give the open folder ``fd`` to the call's user, and return it (closed if that fails):
    by descriptor, so what was made is what is handed over even if a call renamed something
    into its place meanwhile."""
    try:
        if uid is not None and os.geteuid() == 0:
            os.fchown(fd, uid, -1 if gid is None else gid)
    except OSError:
        os.close(fd)
        raise
    return fd


def collect(root: str, call_id: int, uid: int | None, budget: int) -> Collected:
    """Take the call's files (open), then remove its outbox folder. Never raises ``OSError``;
    a folder that cannot be listed (removed, a link, unreadable) is said in ``unlisted``."""
    collected = Collected()
    name = str(call_id)
    if _remove_empty(root, name):
        return collected
    try:
        dfd = _open_dir(root, name)
    except OSError as exc:
        collected.cannot_list(os.path.join(root, name), exc)
        _remove_at(root, name)  # a link the call left in its place
        return collected
    try:
        try:
            chosen = _choose(dfd, collected)
        except OSError as exc:
            collected.cannot_list(os.path.join(root, name), exc)
            chosen = []
        for entry in chosen:
            fd = _open_regular(dfd, entry, uid)
            if fd is None:
                collected.skip(NOT_PLAIN)
                continue
            size = os.fstat(fd).st_size
            if size > budget:
                os.close(fd)
                collected.skip(TOO_BIG)
                continue
            budget -= size
            collected.files.append((entry, fd, size))
    except OSError:
        pass
    finally:
        os.close(dfd)
    _remove_at(root, name)
    return collected


def _choose(dfd: int, collected: Collected) -> list[str]:
    """The first ``FILES_PER_CALL`` names (in order) worth opening, streaming the folder once."""
    heap: list[tuple[bytes, str]] = []  # the largest names kept, negated by ordering below
    candidates = 0
    with os.scandir(dfd) as entries:
        for entry in entries:
            raw = os.fsencode(entry.name)
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                collected.skip(NOT_UTF8)
                continue
            if not entry.is_file(follow_symlinks=False):
                collected.skip(NOT_PLAIN)
                continue
            candidates += 1
            heap.append((raw, entry.name))
            if len(heap) > 4 * FILES_PER_CALL:
                # Keep memory bounded whatever the count: only the first names can be chosen.
                heap = heapq.nsmallest(FILES_PER_CALL, heap)
    chosen = [name for _, name in heapq.nsmallest(FILES_PER_CALL, heap)]
    if candidates > len(chosen):
        collected.skip(TOO_MANY, candidates - len(chosen))
    return chosen


def send_files(
    send: Callable[[dict[str, Any], bytes], None], call_id: int, files: list[tuple[str, int, int]]
) -> None:
    """Send each file as ``file`` frames of exactly its announced size, closing each."""
    for name, fd, size in files:
        offset = 0
        try:
            while offset < size:
                chunk = os.read(fd, min(FILE_CHUNK, size - offset))
                # A file that shrank (another call of the turn truncated it): pad to the size
                # announced, as the host counts bytes.
                chunk = chunk or b"\0" * min(FILE_CHUNK, size - offset)
                send({"type": "file", "id": call_id, "name": name, "offset": offset}, chunk)
                offset += len(chunk)
        finally:
            os.close(fd)


def _remove_empty(parent: str, name: str) -> bool:
    """Remove the folder ``name`` if it is empty, as most calls leave it; say whether it was.

    One ``rmdir`` on a call's path instead of a listing and a walk. It removes
    only an empty folder, never a link (``ENOTDIR``) or a folder holding anything.
    """
    try:
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        os.rmdir(name, dir_fd=pfd)
    except OSError:
        return False
    finally:
        os.close(pfd)
    return True


def _open_dir(parent: str, name: str) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    pfd = os.open(parent, flags)
    try:
        return os.open(name, flags, dir_fd=pfd)
    finally:
        os.close(pfd)


def _open_regular(dfd: int, name: str, uid: int | None) -> int | None:
    """Open an outbox entry only if it is a plain file the call's user owns, with one link."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError:
        return None
    info = os.fstat(fd)
    # A hard link or a file of another owner could be something the call could not read itself.
    if (
        not stat.S_ISREG(info.st_mode)
        or info.st_nlink != 1
        or (uid is not None and info.st_uid != uid)
    ):
        os.close(fd)
        return None
    return fd


def _remove_at(parent: str, name: str) -> None:
    with suppress(OSError):
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            remove_tree(pfd, name)
        finally:
            os.close(pfd)


def remove_tree(pfd: int, name: str, budget: int = REMOVE_BUDGET) -> None:
    """Remove ``name`` under the folder ``pfd`` and all it holds, holding one extra descriptor.

    Walks down into each folder and back up through ``..``, keeping only the
    names on the way down, so the depth costs neither recursion nor
    descriptors. Stops quietly after ``budget`` entries or on an error.
    """
    try:
        os.unlink(name, dir_fd=pfd)
    except IsADirectoryError:
        pass
    except OSError:
        return
    else:
        return
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(name, flags, dir_fd=pfd)
    except OSError:
        return
    path: list[str] = [name]  # the names from ``pfd`` down to ``fd``
    try:
        while budget > 0:
            batch = _entries(fd)
            if not batch:
                # Empty: go up one level and remove it.
                done = path.pop()
                if not path:
                    os.rmdir(done, dir_fd=pfd)
                    return
                parent = os.open("..", flags, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(done, dir_fd=fd)
                continue
            for child in batch:
                budget -= 1
                try:
                    os.unlink(child, dir_fd=fd)
                except IsADirectoryError:
                    # Down into it; the rest of this batch is listed again on the way back.
                    sub = os.open(child, flags, dir_fd=fd)
                    os.close(fd)
                    fd = sub
                    path.append(child)
                    break
    except OSError:
        return  # cannot remove something: leave the rest (the workspace is bounded)
    finally:
        with suppress(OSError):
            os.close(fd)


def _entries(fd: int, most: int = 1024) -> list[str]:
    """Up to ``most`` entries of the folder ``fd`` (never ``.`` or ``..``)."""
    names: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) >= most:
                break
    return names

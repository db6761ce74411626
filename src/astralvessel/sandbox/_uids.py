"""Each turn its own host uid and gid on a root host, leased from a range the host configures.

On a root host a call is uid 65534 inside its own user namespace, and that id
is mapped to a host identity written from outside (``server/_userns``). If
every turn mapped to the same host uid, a file one turn left in a shared
writable mount would be another turn's to read, and the kernel would count
every turn's processes against one host user. So each turn leases a uid of
its own (the gid is the same number) for as long as its sandbox lives.

The range: ``UidRange``, from ``Executor(uid_range=...)``, else the
``ASTRALVESSEL_UID_RANGE`` variable (``FIRST-LAST``), else ``DEFAULT_UID_RANGE``:
65 536 ids from 2 013 265 920 (``0x78000000``). systemd's table of uid ranges
(UIDS-GIDS.md) leaves 1 879 048 192-2 147 352 575 unallocated: above the login
users (1000-60000), ``DynamicUser`` (61184-65519), ``nobody``, the usual
``/etc/subuid`` blocks (100000 upwards, 65536 per user) and the container
ranges of ``systemd-nspawn`` (524288-1879048191), and below 2^31, where some
tools still treat uids as signed. An id the host's user or group database
names is skipped.

The lease: one lock file per uid under ``/run/astralvessel/uids``, held with
``flock`` for as long as the turn's sandbox lives. ``flock`` is host-wide (every
process of every host program sees the same locks), and the kernel drops it
when the last descriptor closes, so a host killed with SIGKILL leaks nothing:
its sandboxes die with it (``--die-with-parent``, the lifeline) and its uids
are free again. The descriptor is close-on-exec and never inherited by a
sandbox, so nothing inside one can hold a lease.

A lease removes its lock file as it ends, so the folder holds about one file
per uid held now, not one per uid ever leased (40 000 were seen). It unlinks
the file while it still holds the lock, and a lessee counts a lock as its
lease only once it holds it *and* the path still names the file it locked:
one that opened the file before it was unlinked, and locked it after, holds a
lock on a file nobody can find, so it closes it and tries the path again,
where the next lessee's new file is the lock. Processes of a version of this
library from before this rule never unlink, but do not check either: do not
run both versions' hosts on one lock folder at once. A process's first lease
in a folder also removes files no lease holds (``remove_free_locks``): those
such versions left, one per uid they ever leased, and those of hosts killed
while they held a lease. At most ``SWEEP_LIMIT`` of them, so a turn's start
pays a bounded part (all of 40 000 files took 1.9 s of CPU, 7.5 s at load 21;
4 096 of them 0.27 s, 1.6 s at load 34); the next processes take the rest.

Only root hosts lease: an ordinary user's unprivileged user namespace can map
no id but the user's own, so there every turn is that user (see the threat
model, "Identity and budget").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import grp
import os
import pwd
import random
import re
import tempfile
import threading
from collections.abc import Mapping

import attrs

from ..errors import BackendUnavailableError, UsageError

__all__ = [
    "DEFAULT_UID_RANGE",
    "LOCK_DIR",
    "SWEEP_LIMIT",
    "UID_RANGE_ENV",
    "UidLease",
    "UidRange",
    "default_lock_dir",
    "describe_range",
    "lease_uid",
    "remove_free_locks",
    "resolve_range",
]

#: The variable a host sets to choose the range for every executor that names none.
UID_RANGE_ENV = "ASTRALVESSEL_UID_RANGE"
#: Where the lock files live: one per uid, ``<uid>.lock``, mode 0600, root's.
LOCK_DIR = "/run/astralvessel/uids"
#: Ids no turn may have: root, the 16-bit ``-1``, ``nobody``, and the 32-bit ``-1``.
_RESERVED = frozenset({0, 65534, 65535, 2**32 - 1})
#: The highest id a range may reach: below 2^31, where some tools treat uids as signed.
_HIGHEST = 2**31 - 2


def _first(instance: UidRange, attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1000:
        raise UsageError(f"a uid range starts at 1000 or above (login users' ids), not {value!r}")


def _count(instance: UidRange, attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"a uid range holds at least one id, not {value!r}")
    last = instance.first + value - 1
    if last > _HIGHEST:
        raise UsageError(f"a uid range ends at {_HIGHEST} at most, not {last}")
    if any(instance.first <= reserved <= last for reserved in _RESERVED):
        raise UsageError(
            f"uid range {instance} holds a reserved id ({sorted(_RESERVED)}); "
            "a turn must never share nobody's or root's id"
        )


@attrs.frozen
class UidRange:
    """The host uids (and the same-numbered gids) turns lease from: ``first`` and ``count`` ids.

    Every construction path checks that the range starts at 1000 or above,
    ends below 2^31 and holds neither ``nobody`` (65534) nor 65535; a bad
    range raises ``UsageError``.
    """

    first: int = attrs.field(validator=_first)
    count: int = attrs.field(validator=_count)

    @property
    def last(self) -> int:
        """The highest id of the range."""
        return self.first + self.count - 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    @classmethod
    def parse(cls, text: str) -> UidRange:
        """Parse ``FIRST-LAST`` (both included), the form of ``ASTRALVESSEL_UID_RANGE``."""
        match = re.fullmatch(r"\s*(\d{1,10})\s*-\s*(\d{1,10})\s*", text)
        if match is None:
            raise UsageError(
                f"a uid range is FIRST-LAST, such as 2013265920-2013331455, not {text!r}"
            )
        first, last = int(match[1]), int(match[2])
        if last < first:
            raise UsageError(f"uid range {text!r} ends before it starts")
        return cls(first, last - first + 1)

    @classmethod
    def coerce(cls, value: UidRange | str) -> UidRange:
        """A ``UidRange`` as given, or parsed from ``FIRST-LAST`` text."""
        if isinstance(value, UidRange):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        raise UsageError(f"a uid range is a UidRange or 'FIRST-LAST' text, not {value!r}")


#: The range when neither the executor nor the environment names one (see the module's note).
DEFAULT_UID_RANGE = UidRange(0x78000000, 65536)


def resolve_range(chosen: UidRange | None, environ: Mapping[str, str] | None = None) -> UidRange:
    """The range a turn leases from: the chosen one, else the environment's, else the default."""
    if chosen is not None:
        return chosen
    text = (os.environ if environ is None else environ).get(UID_RANGE_ENV, "").strip()
    if not text:
        return DEFAULT_UID_RANGE
    try:
        return UidRange.parse(text)
    except UsageError as exc:
        raise UsageError(f"{UID_RANGE_ENV}: {exc}") from None


def describe_range() -> str:
    """The range turns lease from here, for ``doctor``; never raises (a bad variable says so)."""
    try:
        return str(resolve_range(None))
    except UsageError as exc:
        return f"(none: {exc})"


class UidLease:
    """One uid held for one turn until ``release`` (or until this process dies)."""

    def __init__(self, uid: int, fd: int, path: str) -> None:
        self.uid = uid
        self.gid = uid
        self._fd: int | None = fd
        #: The lock file, removed when the lease ends.
        self._path = path
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "held" if self._fd is not None else "released"
        return f"<UidLease {self.uid} {state}>"

    def release(self) -> None:
        """Give the uid back; call once the sandbox that used it is gone. Idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            # Unlinked before the lock drops: a lessee that opened this file meanwhile finds
            # it gone once it holds it, and tries the path again (``_try_lock``).
            if _still_linked(fd, self._path):
                with contextlib.suppress(OSError):
                    os.unlink(self._path)
            os.close(fd)  # closing the only descriptor drops the flock


def _named(uid: int) -> bool:
    """Whether the host's databases name this id as a user or a group (someone else's, then)."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


def _still_linked(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (no one unlinked or replaced it)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _lock_path(lock_dir: str, uid: int) -> str:
    return os.path.join(lock_dir, f"{uid}.lock")


def _try_lock(path: str) -> int | None:
    """The descriptor holding the lock file at ``path``, or None if another lessee holds it.

    Raises ``OSError`` when the file cannot be opened or locked for another reason.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        if _still_linked(fd, path):
            return fd
        # Its lessee released it (unlinking it) between this open and this lock: the file
        # held is no one's lock any more. The path's next file is; each retry follows a
        # release by another lessee, so this ends.
        os.close(fd)


def _lock_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise BackendUnavailableError(
            f"the uid lock folder {path} must be this user's and writable by it alone "
            f"(owner {info.st_uid}, mode {info.st_mode & 0o7777:04o})"
        )
    return path


def default_lock_dir() -> str:
    """``LOCK_DIR`` as root; else a folder of this user's (a Docker host need not be root).

    Locks are host-wide among the processes that share a folder: two ordinary
    users driving one engine lease apart, so give each its own range.
    """
    if os.geteuid() == 0:
        return LOCK_DIR
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(base, f"astralvessel-{os.geteuid()}", "uids")


_LOCK_NAME = re.compile(r"[0-9]{1,10}\.lock")
#: Lock files a process's first lease removes at most (see the module's note).
SWEEP_LIMIT = 4096


def remove_free_locks(lock_dir: str, limit: int | None = None) -> int:
    """Remove the lock files in ``lock_dir`` that no lease holds (at most ``limit``); return
    how many.

    Each is taken as a lease and ended (so removed) by the rule every lease
    keeps: a file a live lease holds stays. Never raises (a file it cannot
    take stays).
    """
    removed = 0
    with contextlib.suppress(OSError), os.scandir(lock_dir) as entries:
        for entry in entries:
            if limit is not None and removed >= limit:
                break
            if not (_LOCK_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)):
                continue
            with contextlib.suppress(OSError):
                fd = _try_lock(entry.path)
                if fd is not None:
                    UidLease(int(entry.name.split(".")[0]), fd, entry.path).release()
                    removed += 1
    return removed


@functools.cache
def _swept_once(lock_dir: str) -> None:
    """At a process's first lease in a folder only: files left there do not come back.

    (Two first leases at once may both sweep: a file is removed once, harmlessly.)
    """
    remove_free_locks(lock_dir, SWEEP_LIMIT)


def lease_uid(uid_range: UidRange, lock_dir: str = LOCK_DIR) -> UidLease:
    """Lease a uid of ``uid_range`` no live turn on this host holds; raise if every one is taken.

    The search starts at a random id of the range, so many processes opening
    turns at once rarely try the same lock. Raises ``BackendUnavailableError``
    when the range has no free id (naming the range and how to widen it) or
    the lock folder cannot be used.
    """
    try:
        folder = _lock_dir(lock_dir)
    except OSError as exc:
        raise BackendUnavailableError(
            f"cannot use the uid lock folder {lock_dir}: {exc.strerror}"
        ) from exc
    _swept_once(folder)
    start = random.randrange(uid_range.count)  # noqa: S311 - spreads the search, no secret
    for step in range(uid_range.count):
        uid = uid_range.first + (start + step) % uid_range.count
        if uid in _RESERVED or _named(uid):
            continue
        path = _lock_path(folder, uid)
        try:
            fd = _try_lock(path)
        except OSError as exc:
            raise BackendUnavailableError(
                f"cannot lock uid {uid} in {folder}: {exc.strerror}"
            ) from exc
        if fd is not None:
            return UidLease(uid, fd, path)
    raise BackendUnavailableError(
        f"every uid of the range {uid_range} is held by a live turn on this host "
        f"({uid_range.count} ids): close turns, or widen the range with "
        f"Executor(uid_range='FIRST-LAST') or {UID_RANGE_ENV}"
    )

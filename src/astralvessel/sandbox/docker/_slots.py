"""A bound on holders at once, in this process and, optionally, in every process of this user.

Why across processes. An eval harness runs several worker processes on one
machine, each with its own ``Docker`` backends; a bound kept per process lets
eight of them send the engine eight times the requests it was meant to see at
once. So the ``runc`` bound is also a set of lock files, one per slot, in a
folder of this user's keyed by the engine's address: a holder holds one
file's ``flock``. The kernel drops a lock when its process dies, however it
dies, so a crashed worker never keeps a slot. Every process of the user that
drives the same engine counts against the same files, each up to its own
size: processes with different sizes share the lower slots, so the machine
never has more holders than the largest size among them.

A thread first passes the process's own semaphore (so at most ``size`` of a
process's threads ever look at the files), then takes a slot none of its
process's threads holds and the kernel lets it lock, trying every slot without
waiting; if all are held elsewhere it tries again after a short pause, up to
its deadline. Each process keeps one open descriptor per slot: opening a file
per attempt would cost a system call per slot per pause for every waiter.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable

from ...errors import BackendUnavailableError

__all__ = ["Bound", "Slot", "engine_key", "slot_folder"]

#: The longest pause between two rounds of tries while every slot is held elsewhere.
_MAX_PAUSE = 0.02
#: The engine a client reaches without an address (the SDK's and the CLI's default).
_DEFAULT_ENGINE = "unix:///var/run/docker.sock"


def engine_key(address: str) -> str:
    """A file-name-safe key for an engine address; a unix socket is keyed by its real path."""
    address = address or _DEFAULT_ENGINE
    for prefix in ("unix://", "http+unix://"):
        if address.startswith(prefix):
            address = "unix://" + os.path.realpath(address[len(prefix) :])
            break
    return hashlib.sha256(address.encode()).hexdigest()[:16]


def slot_folder(runtime: str, address: str) -> str:
    """Make (or check) ``runtime/engines/KEY``: this user's alone, no link, 0700 at each level.

    Raises ``BackendUnavailableError`` naming the folder when another user owns
    a level of it or can write there (they could then hold every slot).

    The folder and its lock files are never removed, by design. A process that
    removed them could not know that no other one had just opened them: that
    one would then lock files no longer in the folder while later processes
    lock new ones of the same names, and the machine-wide bound would silently
    count twice. Making removal safe takes a second lock over the folder on
    every process's first place; the leftover is one folder of ``size`` empty
    files per engine address this user drove, under ``/run`` or
    ``XDG_RUNTIME_DIR`` (both emptied at reboot, the latter at logout).
    """
    folder = os.path.join(runtime, "engines", engine_key(address))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        for level in (runtime, os.path.dirname(folder), folder):
            info = os.lstat(level)
            if info.st_uid != os.geteuid() or info.st_mode & 0o022 or not os.path.isdir(level):
                raise BackendUnavailableError(
                    f"the engine's slot folder {level} must be a folder of uid {os.geteuid()} "
                    f"that no one else may write (owner {info.st_uid}, mode "
                    f"{info.st_mode & 0o7777:04o}); fix it, or keep the bound per host process "
                    "with Docker(engine_scope='process')"
                )
    except OSError as exc:
        raise BackendUnavailableError(
            f"cannot use the engine's slot folder {folder}: {exc.strerror}; keep the bound "
            "per host process with Docker(engine_scope='process')"
        ) from exc
    return folder


class Slot:
    """One place in a ``Bound``; ``release`` gives it back (once, from any thread)."""

    def __init__(self, bound: Bound, index: int | None) -> None:
        self._bound = bound
        #: The lock file held, or ``None`` for a bound kept in this process only.
        self.index = index
        self._released = False

    def release(self) -> None:
        """Give the place back. Idempotent."""
        with self._bound._state:
            if self._released:
                return
            self._released = True
        self._bound._give_back(self.index)


class Bound:
    """At most ``size`` holders at once: in this process, and across processes sharing ``folder``.

    ``folder=None`` keeps the bound in this process only; a callable names the
    folder when a place is first taken (so making a backend never fails on
    it; the first request that needs a place does, with the folder's error).
    ``with bound:`` holds
    a place for the block, waiting as long as it takes; ``acquire(deadline)``
    holds one until ``Slot.release``, and raises ``TimeoutError`` at the
    deadline (a ``time.monotonic`` value).
    """

    def __init__(self, size: int, folder: str | Callable[[], str] | None = None) -> None:
        self.size = size
        #: Whether host processes share this bound (through lock files).
        self.shared = folder is not None
        self._locate = folder if callable(folder) else None
        #: The lock files' folder, once known.
        self.folder = folder if isinstance(folder, str) else None
        self._local = threading.BoundedSemaphore(size)
        self._state = threading.Lock()
        self._fds: list[int] = []
        self._pid = 0
        self._mine: set[int] = set()
        self._entered = threading.local()

    def acquire(self, deadline: float | None = None) -> Slot:
        """Hold a place; ``TimeoutError`` if none frees before ``deadline``."""
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not self._local.acquire(timeout=timeout):
            raise TimeoutError(f"no engine slot freed in this process ({self.size} held)")
        if not self.shared:
            return Slot(self, None)
        try:
            return Slot(self, self._lock_a_file(deadline))
        except BaseException:
            self._local.release()
            raise

    def _give_back(self, index: int | None) -> None:
        if index is not None:
            with self._state:
                if self._pid == os.getpid():
                    fcntl.flock(self._fds[index], fcntl.LOCK_UN)
                self._mine.discard(index)
        self._local.release()

    def _lock_a_file(self, deadline: float | None) -> int:
        pause = 0.001
        while True:
            with self._state:
                fds = self._open_files()
                free = [i for i in range(self.size) if i not in self._mine]
                # A random first slot spreads many processes' first tries over the files.
                start = random.randrange(len(free))  # noqa: S311 - spreads tries, no secret
                for index in free[start:] + free[:start]:
                    try:
                        fcntl.flock(fds[index], fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError as exc:
                        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                            raise
                        continue
                    self._mine.add(index)
                    return index
            if deadline is not None and time.monotonic() + pause > deadline:
                raise TimeoutError(
                    f"every engine slot in {self.folder} stayed held by other host processes"
                )
            time.sleep(pause * (0.5 + random.random()))  # noqa: S311 - jitter, no secret
            pause = min(pause * 2, _MAX_PAUSE)

    def _open_files(self) -> list[int]:
        """This process's descriptors of the slot files (opened again in a forked child).

        A child shares its parent's open file descriptions, and with them the
        parent's locks: it must lock files of its own opening.
        """
        if self._pid != os.getpid():
            for fd in self._fds if self._pid else ():
                with contextlib.suppress(OSError):
                    os.close(fd)
            if self.folder is None:
                assert self._locate is not None  # noqa: S101 - only called for a shared bound
                self.folder = self._locate()
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            self._fds = [
                os.open(os.path.join(self.folder, f"slot-{i}.lock"), flags, 0o600)
                for i in range(self.size)
            ]
            self._pid = os.getpid()
            self._mine = set()
        return self._fds

    def __enter__(self) -> Slot:
        slot = self.acquire()
        stack = getattr(self._entered, "slots", None)
        if stack is None:
            stack = self._entered.slots = []
        stack.append(slot)
        return slot

    def __exit__(self, *_exc: object) -> None:
        self._entered.slots.pop().release()

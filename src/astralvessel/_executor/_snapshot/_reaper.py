"""Removing dropped snapshot trees off the caller's thread: one daemon thread per process.

A tree of 10 000 files takes 0.4-1.3 s to remove (10 s on a loaded host), and
the last ``TurnSnapshot`` holding it may be dropped anywhere: in a model's
loop, in an event loop's thread. So a dropped tree is queued and one daemon
thread removes it. ``drain`` waits for the queue (a test, or anything that must
see the disk free); at interpreter exit whatever is left is removed before the
process ends. In a child forked from the host the queue and thread start
afresh and empty: the parent's trees are the parent's to remove.

The queue never stalls: a folder still busy (EBUSY, a lazy unmount under way)
waits its turn again behind the others, with a growing pause, for at most
``BUSY_SECONDS``; a removal that raises is logged (``snapshot.removal_failed``)
and the thread goes on; where no thread can start (at interpreter shutdown, a
thread limit) or the exit hook has run, the caller removes the folder itself.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from ..._ground import _mounts
from ..._ground._log import SNAPSHOTS, WARNING, event
from ..._ground._removal import remove_folder, remove_once

__all__ = ["BUSY_SECONDS", "drain", "enqueue", "remove_folder"]

#: How long a folder that is busy (EBUSY: Docker's lazy unmount of a copy-on-write
#: workspace over the tree may still be going) is tried again before it is left.
BUSY_SECONDS = 10.0
#: The first pause before a busy folder is tried again, doubled at each try up to the last.
BUSY_PAUSE = 0.1
BUSY_PAUSE_MAX = 2.0


@attrs.frozen
class Job:
    """A removal: the folder, what to do just before it goes (give the budget back), and
    for a busy folder tried again, when it may be tried and when it is left.

    ``unmount``: a frozen layer's mount in the folder, detached first (``MNT_DETACH``;
    a last unmount frees the layer's tmpfs, which for thousands of files takes as long
    as removing a tree: off the caller's thread too).
    """

    folder: Path
    before: Callable[[], None] | None = None
    due: float = 0.0  # time.monotonic()
    pause: float = BUSY_PAUSE
    deadline: float | None = None
    unmount: Path | None = None

    def later(self) -> Job | None:
        """This job once more after a pause (``before`` has run), or None past its time."""
        now = time.monotonic()
        deadline = now + BUSY_SECONDS if self.deadline is None else self.deadline
        if now >= deadline:
            return None
        return Job(
            self.folder,
            None,
            due=now + self.pause,
            pause=min(self.pause * 2, BUSY_PAUSE_MAX),
            deadline=deadline,
        )


class _Reaper:
    """The queue and its thread, for one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.cond = threading.Condition()
        self.jobs: collections.deque[Job] = collections.deque()
        self.waiting: list[Job] = []  # busy folders, each to be tried again once due
        self.busy = 0  # jobs taken off the queue and not yet done
        self.thread: threading.Thread | None = None
        self.exiting = False

    def put(self, job: Job) -> None:
        with self.cond:
            if not (self.exiting or sys.is_finalizing()):
                self.jobs.append(job)
                self.cond.notify_all()
                if self.thread is not None or self._start():
                    return
                # No thread: whatever the queue holds is the caller's to remove.
                left = self._take_all()
            else:
                left = [job]
        # Past the exit hook no thread is sure to run again: remove them here.
        for each in left:
            _run_inline(each)

    def _start(self) -> bool:
        """Start the thread (the condition held); False if none can start."""
        thread = threading.Thread(target=self.run, name="astralvessel-snapshot-reaper", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't create new thread" (at shutdown, past a thread limit)
            return False
        self.thread = thread
        return True

    def _take_all(self) -> list[Job]:
        left = [*self.jobs, *self.waiting]
        self.jobs.clear()
        self.waiting.clear()
        return left

    def run(self) -> None:
        while True:
            with self.cond:
                job = self._next()
                self.busy += 1
            again = None
            try:
                again = _run_once(job)
            finally:
                with self.cond:
                    if again is not None:
                        self.waiting.append(again)
                    self.busy -= 1
                    self.cond.notify_all()

    def _next(self) -> Job:
        """The next job to run (the condition held), waiting for one to be queued or due."""
        while True:
            now = time.monotonic()
            for job in [job for job in self.waiting if job.due <= now]:
                self.waiting.remove(job)
                self.jobs.append(job)
            if self.jobs:
                return self.jobs.popleft()
            self.cond.wait(min((job.due for job in self.waiting), default=now + 3600) - now)

    def drain(self, timeout: float | None) -> bool:
        with self.cond:
            return self.cond.wait_for(
                lambda: not self.jobs and not self.waiting and not self.busy, timeout
            )

    def at_exit(self) -> None:
        if os.getpid() != self.pid:
            return
        with self.cond:
            self.exiting = True
            left = self._take_all()
        for job in left:
            _run_inline(job)
        # The one the thread holds, if any: it is a daemon, which exit would cut off mid-tree.
        self.drain(BUSY_SECONDS)


_reaper = _Reaper()


def _at_exit() -> None:
    _reaper.at_exit()  # the process's reaper at exit, a forked child's its own


def _after_fork_in_child() -> None:
    global _reaper  # noqa: PLW0603 - the parent's queue and thread are not the child's
    _reaper = _Reaper()


os.register_at_fork(after_in_child=_after_fork_in_child)
# Registered at import, before any tree exists: exit hooks run last first, so this one runs
# after the finalizers' own hook has queued the trees still alive.
atexit.register(_at_exit)


def enqueue(
    folder: Path,
    before: Callable[[], None] | None = None,
    owner: int | None = None,
    *,
    unmount: Path | None = None,
) -> None:
    """Remove ``folder`` in the background, calling ``before`` first (and unmounting
    ``unmount``, a frozen layer's mount in it); nothing in a process other than ``owner``
    (a child forked from the host holds copies, not the trees)."""
    if owner is not None and os.getpid() != owner:
        return
    _reaper.put(Job(folder, before, unmount=unmount))


def drain(timeout: float | None = None) -> bool:
    """Wait until every folder queued so far is removed; False if ``timeout`` passed first."""
    return _reaper.drain(timeout)


def _run_once(job: Job) -> Job | None:
    """One attempt at ``job``: the job to try again when its folder is busy, else None.

    Never raises: a removal that fails is logged, and the folder left for a sweep.
    """
    try:
        try:
            if job.before is not None:
                job.before()
        finally:
            _unmount(job)
            done = remove_once(job.folder)
    except Exception as exc:  # one bad removal must not end the thread
        _failed(job.folder, exc)
        return None
    return None if done else job.later()


def _run_inline(job: Job) -> None:
    """``job`` on the caller's thread, busy retries included (no thread will come back)."""
    try:
        try:
            if job.before is not None:
                job.before()
        finally:
            _unmount(job)
            left = BUSY_SECONDS if job.deadline is None else job.deadline - time.monotonic()
            remove_folder(job.folder, max(left, 0.0))
    except Exception as exc:  # at exit, or in a caller that only dropped a value
        _failed(job.folder, exc)


def _unmount(job: Job) -> None:
    """Detach the job's frozen layer, once (a busy folder's job comes back): its mount
    point is then an empty folder, which the folder's removal takes."""
    if job.unmount is not None and os.path.ismount(job.unmount):
        _mounts.unmount(str(job.unmount))


def _failed(folder: Path, exc: Exception) -> None:
    event(
        SNAPSHOTS,
        "snapshot.removal_failed",
        {"folder": str(folder), "error": f"{type(exc).__name__}: {exc}"},
        WARNING,
    )

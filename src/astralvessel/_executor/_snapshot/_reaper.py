"""Removing dropped snapshot trees off the caller's thread: one daemon thread per process.

A tree of 10 000 files takes 0.4-1.3 s to remove (10 s on a loaded host), and
the last ``TurnSnapshot`` holding it may be dropped anywhere: in a model's
loop, in an event loop's thread. So a dropped tree is queued and one daemon
thread removes it. ``drain`` waits for the queue (a test, or anything that must
see the disk free); at interpreter exit whatever is left is removed before the
process ends. In a child forked from the host the queue and thread start
afresh and empty: the parent's trees are the parent's to remove.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ..._ground._removal import remove_folder

__all__ = ["BUSY_SECONDS", "drain", "enqueue", "remove_folder"]

#: How long a folder that is busy (EBUSY: Docker's lazy unmount of a copy-on-write
#: workspace over the tree may still be going) is tried again before it is left.
BUSY_SECONDS = 10.0

#: A removal: the folder, and what to do just before it goes (give the budget back).
Job = tuple[Path, Callable[[], None] | None]


class _Reaper:
    """The queue and its thread, for one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.cond = threading.Condition()
        self.jobs: collections.deque[Job] = collections.deque()
        self.busy = 0  # jobs taken off the queue and not yet done
        self.thread: threading.Thread | None = None
        self.exiting = False

    def put(self, job: Job) -> None:
        with self.cond:
            if not self.exiting:
                self.jobs.append(job)
                self.cond.notify_all()
                if self.thread is None:
                    self.thread = threading.Thread(
                        target=self.run, name="astralvessel-snapshot-reaper", daemon=True
                    )
                    self.thread.start()
                return
        # Past the exit hook no thread is sure to run again: remove it here.
        _run(job)

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.jobs:
                    self.cond.wait()
                job = self.jobs.popleft()
                self.busy += 1
            try:
                _run(job)
            finally:
                with self.cond:
                    self.busy -= 1
                    self.cond.notify_all()

    def drain(self, timeout: float | None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: not self.jobs and not self.busy, timeout)

    def at_exit(self) -> None:
        if os.getpid() != self.pid:
            return
        with self.cond:
            self.exiting = True
            left = list(self.jobs)
            self.jobs.clear()
        for job in left:
            _run(job)
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
    folder: Path, before: Callable[[], None] | None = None, owner: int | None = None
) -> None:
    """Remove ``folder`` in the background, calling ``before`` first; nothing in a process
    other than ``owner`` (a child forked from the host holds copies, not the trees)."""
    if owner is not None and os.getpid() != owner:
        return
    _reaper.put((folder, before))


def drain(timeout: float | None = None) -> bool:
    """Wait until every folder queued so far is removed; False if ``timeout`` passed first."""
    return _reaper.drain(timeout)


def _run(job: Job) -> None:
    folder, before = job
    try:
        if before is not None:
            before()
    finally:
        remove_folder(folder, BUSY_SECONDS)

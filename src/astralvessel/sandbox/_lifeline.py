"""One long-lived thread starts every sandbox process, so a turn belongs to no thread.

Linux sends a child its parent-death signal (bubblewrap's ``--die-with-parent``,
``PR_SET_PDEATHSIG``) when the *thread* that forked it exits, not when its
process does. A turn whose sandbox was started from a short-lived thread (the
thread pool an agent framework runs parallel tool calls in) would be killed
with that thread, between two rounds of calls. So every sandbox process is
forked from one daemon thread that lives exactly as long as the host process:
a sandbox then dies with the process, whichever thread opened its turn or made
its calls, and never with a mere thread.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["on_lifeline"]

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]


class _Lifeline:
    """The thread, started on first use (and again in a forked child, which has no threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = -1

    def run(self, job: Callable[[], T]) -> T:
        """Run ``job`` on the lifeline thread and return its result (or raise its exception)."""
        if threading.current_thread() is self._thread:
            return job()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                # A forked child inherits no thread, and the queue may hold the parent's jobs.
                self._jobs = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._serve,
                    args=(self._jobs,),
                    name="astralvessel-lifeline",
                    daemon=True,
                )
                # Kept only once started: a thread that could not start (RuntimeError, at
                # shutdown or past a thread limit) would leave every later job waiting.
                thread.start()
                self._thread, self._pid = thread, os.getpid()
            self._jobs.put((job, future))
        return future.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
        while True:
            job, future = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = job()
            except BaseException as exc:  # handed to the caller, who raises it
                future.set_exception(exc)
            else:
                future.set_result(result)


_LIFELINE = _Lifeline()


def on_lifeline(job: Callable[[], T]) -> T:
    """Run ``job`` (one that starts a process) on the thread that lives as long as this process."""
    return _LIFELINE.run(job)

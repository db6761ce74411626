"""Warm sandboxes: turns started ahead of time, so opening a turn takes a ready one.

An eval harness or an RL rollout opens a turn per sample, and a turn's start
(the sandbox plus the server's boot) then costs more than all its calls. A
``WarmPool`` keeps ``size`` sandboxes started for one policy, from one
background thread, and starts another each time a turn takes one. A sandbox
goes to exactly one turn and dies with it: no file, process or state of one
turn can reach the next, exactly as with a sandbox started cold.

Every sandbox process is forked on the lifeline thread (``sandbox._lifeline``),
so neither the filler thread nor the thread that opened a turn takes a
sandbox with it when it ends.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from .._ground import _log
from ..errors import UsageError
from ..sandbox._base import Sandbox, SandboxSession
from ..sandbox._owner import Owner
from ..sandbox._policy import Policy

__all__ = ["WarmPool"]

#: How often the filler looks for a waiting sandbox that died, to replace it.
_PRUNE_SECONDS = 1.0
#: How long ``close`` waits for a start in flight (a server's ready timeout bounds it).
_CLOSE_WAIT = 60.0


def check_warm(size: object) -> int:
    """The pool size the host asked for, or ``UsageError`` if it is not a count."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise UsageError(f"warm is the number of sandboxes to keep started, not {size!r}")
    return size


class WarmPool:
    """``size`` sandboxes for ``policy``, started ahead on a background thread.

    ``take`` never blocks on a start: it hands out a ready sandbox or None, and
    the caller starts one cold. A start that fails stops the filling until the
    next ``take`` (the cold start in the turn then raises the host's error), so
    a backend that cannot start here is never retried in a loop.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        policy: Policy,
        size: int,
        *,
        start: Callable[[], SandboxSession] | None = None,
        discard: Callable[[SandboxSession], None] | None = None,
        total: int | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.policy = policy
        self.size = check_warm(size)
        #: How many sandboxes the pool may still start (None: no end); a pool of forks'
        #: sandboxes starts one per fork at most, and its filler ends with the last.
        self._left = total
        # How a sandbox is started and thrown away: by default the backend's start and
        # close; a turn with a network starts (and ends) its egress proxy with them.
        self._start: Callable[[], SandboxSession] = start or (lambda: sandbox.start(policy))
        self._discard: Callable[[SandboxSession], None] = discard or (lambda s: s.close())
        self._ready: collections.deque[SandboxSession] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        #: The process whose sandboxes these are: a forked child neither takes nor ends them.
        self._owner = Owner()
        self._failure: Exception | None = None
        self._thread = threading.Thread(target=self._fill, name="astralvessel-warm", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> int:
        """How many started sandboxes are waiting for a turn now."""
        with self._cond:
            return len(self._ready)

    def take(self) -> SandboxSession | None:
        """A started, still running sandbox for one turn, or None when none is ready
        (always in a forked child: the waiting sandboxes are its parent's)."""
        if self._owner.forked():
            return None
        dead: list[SandboxSession] = []
        session: SandboxSession | None = None
        with self._cond:
            while self._ready:
                candidate = self._ready.popleft()
                if candidate.alive():
                    session = candidate
                    break
                dead.append(candidate)
            # Taking (or finding none) asks for a refill, and retries a start that failed.
            self._failure = None
            self._cond.notify_all()
        for corpse in dead:
            self._discard(corpse)
        return session

    def wait_filled(self, timeout: float | None = None) -> bool:
        """Block until ``size`` sandboxes are ready; False if ``timeout`` passed first.

        Raises what starting a sandbox raised, when the filler could not start one.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < self.size and not self._closed:
                if self._failure is not None:
                    raise self._failure
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return not self._closed

    def close(self) -> None:
        """Stop filling and kill every sandbox still waiting. Idempotent; never raises.

        In a forked child (the executor's finalizer runs at its exit) it only stops.
        """
        if self._owner.forked():
            self._closed = True
            return
        with self._cond:
            self._closed = True
            waiting = list(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        for session in waiting:
            self._discard(session)
        if self._thread is not threading.current_thread():
            self._thread.join(_CLOSE_WAIT)

    # -- the filler thread -----------------------------------------------------------------

    def _wanted(self) -> bool:
        """Whether to start one more sandbox now (called holding the condition)."""
        if self._left is not None and self._left <= 0:
            return False
        return not self._closed and self._failure is None and len(self._ready) < self.size

    @property
    def spent(self) -> bool:
        """Whether the pool will start no more sandboxes and holds none ready."""
        with self._cond:
            return self._closed or (self._left is not None and self._left <= 0 and not self._ready)

    def _prune(self) -> list[SandboxSession]:
        """Take the waiting sandboxes that died out of the queue (holding the condition)."""
        dead = [s for s in self._ready if not s.alive()]
        for session in dead:
            self._ready.remove(session)
        return dead

    def _fill(self) -> None:
        while True:
            with self._cond:
                if not self._wanted():
                    self._cond.wait(_PRUNE_SECONDS)
                if self._closed or (self._left is not None and self._left <= 0):
                    return
                dead = self._prune()
                start = self._wanted()
                if start and self._left is not None:
                    self._left -= 1
            for corpse in dead:
                self._discard(corpse)
            if start:
                self._start_one()

    def _start_one(self) -> None:
        started = time.monotonic()
        try:
            session = self._start()
        except Exception as exc:
            with self._cond:
                self._failure = exc
                self._cond.notify_all()
            _log.event(_log.WARM, "warm.failed", {"error": type(exc).__name__}, _log.WARNING)
            return
        with self._cond:
            keep = not self._closed
            if keep:
                self._ready.append(session)
                self._cond.notify_all()
            ready = len(self._ready)
        fields = {"backend": session.backend, "ready": ready, "size": self.size}
        _log.event(_log.WARM, "warm.refilled", {**fields, "duration": time.monotonic() - started})
        if not keep:
            self._discard(session)

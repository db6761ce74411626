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

A pool of forks' sandboxes (``Turn.fork``) is also waited on: ``wait_ready`` until
as many as ``fork``'s ``ready`` are, and ``take(adopt=True)`` for the start in
flight that no other taker has claimed, rather than a second, redundant start
beside it. The counts that make this safe across threads (``_starting``,
``_claims``, ``started``) change only under the pool's condition.
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
#: How long ``wait_ready`` and an adopting ``take`` wait for a start in flight at most: a
#: server's ready timeout (30 s) and a restore's bound it; past it the caller starts cold.
AHEAD_WAIT = 60.0
#: How often an adopting ``take`` looks at its ``abandon`` event (a turn closing meanwhile).
_ABANDON_POLL = 0.05
#: How long a take by a fork's adoption holds the refills back (``take(settle=...)``).
ADOPTED_SETTLE = 1.0


def check_warm(size: object) -> int:
    """The pool size the host asked for, or ``UsageError`` if it is not a count."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise UsageError(f"warm is the number of sandboxes to keep started, not {size!r}")
    return size


class WarmPool:
    """``size`` sandboxes for ``policy``, started ahead on a background thread.

    ``take`` never blocks on a start unless it adopts one (``adopt``): it hands
    out a ready sandbox or None, and the caller starts one cold. A start that
    fails stops the filling until the next ``take`` (the cold start in the turn
    then raises the host's error), so a backend that cannot start here is never
    retried in a loop.
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
        fillers: int = 1,
        first_alone: bool = True,
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
        #: Starts in flight, and takers waiting for one of them (``take(adopt=True)``): a
        #: ready sandbox goes to a waiting taker first, and no more wait than can be served.
        self._starting = 0
        self._claims = 0
        #: How many sandboxes the pool has started (each went, or goes, to one turn at most).
        self.started = 0
        #: Filler threads still to start once the first sandbox is ready: a forks' pool
        #: starts more than one at a time, but never beside the start its ``fork`` waits
        #: on when that is the first alone (``first_alone``); a ``fork`` waiting for more
        #: than one is served sooner by every filler at once.
        at_once = 1 if first_alone else fillers
        self._more_fillers = fillers - at_once
        #: Why no filler thread could start, when none runs (a thread limit, interpreter
        #: shutdown): no start is then coming, which ends the waits rather than hold them.
        self._no_thread: RuntimeError | None = None
        self._threads: list[threading.Thread] = []
        #: Fillers running: counted down by a filler as it decides to end, under the
        #: condition, so ``extend`` never takes one that is ending for one that goes on.
        self._running = 0
        self._fillers = fillers
        #: Until when the filler starts nothing (``take(settle=...)``; monotonic seconds).
        self._settle_until = 0.0
        for _ in range(at_once):
            self._add_filler()

    @property
    def ready(self) -> int:
        """How many started sandboxes are waiting for a turn now."""
        with self._cond:
            return len(self._ready)

    def take(
        self,
        *,
        adopt: bool = False,
        abandon: threading.Event | None = None,
        settle: float = 0.0,
    ) -> SandboxSession | None:
        """A started, still running sandbox for one turn, or None when none is ready
        (always in a forked child: the waiting sandboxes are its parent's).

        With ``adopt``, when none is ready but a start no other taker has claimed is
        in flight, wait for that one (``AHEAD_WAIT`` at most, or until ``abandon`` is
        set) rather than have the caller start a second beside it; a taker that gets
        none gives up one of a bounded pool's starts, since it starts its own.

        With ``settle``, a taker that got one holds the refill back for that many
        seconds (never longer than from the first such take on): a fork's adoption,
        whose first call comes right after ``fork`` returns, with its siblings' beside
        it, is served before sandbox starts (a container's, on Docker) compete with it
        for the host's cores. Only a sandbox taken delays: a pool holding none ready
        has no adoption to settle, so forking on and on never stops its refills.
        """
        if self._owner.forked():
            return None
        dead: list[SandboxSession] = []
        with self._cond:
            session = self._pop_live(dead, claimed=False)
            if session is None and adopt and len(self._ready) + self._starting > self._claims:
                session = self._adopt(dead, time.monotonic() + AHEAD_WAIT, abandon)
            if session is None and adopt and self._left is not None and self._left > 0:
                self._left -= 1
            now = time.monotonic()
            if session is not None and settle > 0 and self._settle_until <= now:
                self._settle_until = now + settle
            # Taking (or finding none) asks for a refill, and retries a start that failed.
            self._failure = None
            self._cond.notify_all()
        for corpse in dead:
            self._discard(corpse)
        return session

    def _pop_live(self, dead: list[SandboxSession], *, claimed: bool) -> SandboxSession | None:
        """The first live ready sandbox this taker may have, the dead ones put in ``dead``
        (holding the condition): a taker with no claim leaves those the claims are owed."""
        while len(self._ready) > (0 if claimed else self._claims):
            candidate = self._ready.popleft()
            if candidate.alive():
                return candidate
            dead.append(candidate)
        return None

    def _adopt(
        self, dead: list[SandboxSession], deadline: float, abandon: threading.Event | None
    ) -> SandboxSession | None:
        """Claim a start in flight and wait for a sandbox (holding the condition); None
        when the starts in flight no longer cover every claim (one failed, or a ready
        one died), the pool closed, ``abandon`` was set, or the deadline passed."""
        self._claims += 1
        try:
            while True:
                session = self._pop_live(dead, claimed=True)
                if session is not None:
                    return session
                remaining = deadline - time.monotonic()
                gone = self._closed or self._starting < self._claims
                if gone or remaining <= 0 or (abandon is not None and abandon.is_set()):
                    return None
                # An event cannot wake a condition: with one to watch, look again shortly.
                self._cond.wait(remaining if abandon is None else min(remaining, _ABANDON_POLL))
        finally:
            self._claims -= 1

    def wait_ready(
        self, count: int = 1, timeout: float = AHEAD_WAIT, abandon: threading.Event | None = None
    ) -> bool:
        """Block until ``count`` sandboxes are ready; False, never an error, when a start
        failed, the pool closed, it will start no more (it is full, or spent), ``abandon``
        was set, or ``timeout`` passed with no start ending (the bound is per start, so
        a wait for many is bounded by each of its starts, not by their sum).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = self.started
            while len(self._ready) < count:
                if self.started != seen:  # a start ended: the next one gets its own bound
                    seen, deadline = self.started, time.monotonic() + timeout
                remaining = deadline - time.monotonic()
                stalled = not self._starting and (not self._wanted() or not self._filling())
                gone = self._closed or self._failure is not None or stalled
                if gone or remaining <= 0 or (abandon is not None and abandon.is_set()):
                    return False
                # An event cannot wake a condition: with one to watch, look again shortly.
                self._cond.wait(remaining if abandon is None else min(remaining, _ABANDON_POLL))
            return True

    def wait_filled(self, timeout: float | None = None) -> bool:
        """Block until ``size`` sandboxes are ready; False if ``timeout`` passed first.

        Raises what starting a sandbox raised, when the filler could not start one, or
        why no filler thread could start (then no start is ever coming).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while len(self._ready) < self.size and not self._closed:
                if self._failure is not None:
                    raise self._failure
                if self._no_thread is not None and not self._starting and not self._filling():
                    raise self._no_thread
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
        with self._cond:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(_CLOSE_WAIT)

    # -- the filler thread -----------------------------------------------------------------

    def _add_filler(self) -> None:
        """Start one more filler thread (holding the condition, or before any runs); one
        that cannot start is logged, and only when no filler runs do the waits end."""
        thread = threading.Thread(target=self._fill, name="astralvessel-warm", daemon=True)
        with self._cond:
            self._running += 1  # before it runs: its own count down may come first
        try:
            thread.start()
        except RuntimeError as exc:  # can't start new thread: a limit, or the exit
            with self._cond:
                self._running -= 1
                if not self._running:
                    self._no_thread = exc
                    self._cond.notify_all()
            _log.event(_log.WARM, "warm.no_thread", {"error": str(exc)}, _log.WARNING)
            return
        with self._cond:  # a pool extended again and again keeps only its live fillers
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)

    def _filling(self) -> bool:
        """Whether a filler thread runs, or is about to (holding the condition)."""
        return self._running > 0

    def extend(self, forks: int, size: int) -> None:
        """Start ``forks`` more sandboxes, keeping ``size`` ready at least: a fork of a
        fork that has not started (the same files) shares its parent's pool, which grows
        by its forks rather than leave them the parent's. A filler that ended is replaced."""
        with self._cond:
            if self._closed:
                return
            if self._left is not None:
                self._left += forks
            self.size = max(self.size, size)
            self._no_thread = None
            for _ in range(min(forks, self._fillers) - self._running):
                self._add_filler()
            self._cond.notify_all()

    def _wanted(self) -> bool:
        """Whether to start one more sandbox now (called holding the condition): the
        starts in flight count, as another filler's may be."""
        if self._left is not None and self._left <= 0:
            return False
        wanted = len(self._ready) + self._starting < self.size
        return not self._closed and self._failure is None and wanted

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
        counted = False
        try:
            counted = self._fill_until_done()
        finally:
            if not counted:  # ended by an error: the count must still say it is gone
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

    def _fill_until_done(self) -> bool:
        """Start sandboxes while the pool wants them; True once this filler has counted
        itself out (under the condition, as it decided to end)."""
        while True:
            with self._cond:
                if not self._wanted() and not self._closed:  # closed: no wait for a notify
                    self._cond.wait(_PRUNE_SECONDS)
                if self._closed or (self._left is not None and self._left <= 0):
                    self._running -= 1
                    self._cond.notify_all()
                    return True
                settling = self._settle_until - time.monotonic()
                if settling > 0 and self._wanted():
                    self._cond.wait(settling)
                    continue
                dead = self._prune()
                start = self._wanted()
                if start:
                    self._starting += 1
                    if self._left is not None:
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
                self._starting -= 1
                self._failure = exc
                self._cond.notify_all()
            _log.event(_log.WARM, "warm.failed", {"error": type(exc).__name__}, _log.WARNING)
            return
        with self._cond:
            self._starting -= 1
            self.started += 1
            keep = not self._closed
            if keep:
                self._ready.append(session)
            self._cond.notify_all()  # a claimer waits on the start even when it is thrown away
            ready = len(self._ready)
            more = self._more_fillers if keep else 0
            self._more_fillers -= more
            for _ in range(more):
                self._add_filler()
        fields = {"backend": session.backend, "ready": ready, "size": self.size}
        _log.event(_log.WARM, "warm.refilled", {**fields, "duration": time.monotonic() - started})
        if not keep:
            self._discard(session)

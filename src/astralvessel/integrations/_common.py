"""What the framework integrations share: one turn per framework run."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..executor import Executor, Turn

__all__ = ["RunTurns"]


class RunTurns:
    """An executor's turns, one per framework run, each keyed by an object the run owns.

    The first call of a run opens its turn (the sandbox itself starts on the
    first call that needs it); the turn ends when ``end`` is called for the run
    or, at the latest, when the run's object is garbage collected.
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._turns: dict[int, Turn] = {}
        self._finalizers: dict[int, weakref.finalize[[int], object]] = {}
        self._lock = threading.Lock()

    def turn_for(self, owner: object) -> Turn:
        """The turn of the run that owns ``owner``, opened now if this is its first call."""
        key = id(owner)
        with self._lock:
            turn = self._turns.get(key)
            if turn is None:
                turn = self._turns[key] = self.executor.turn()
                # The finalizer runs as the owner dies, before its id() can be reused.
                self._finalizers[key] = weakref.finalize(owner, self._end, key)
        return turn

    def end(self, owner: object) -> None:
        """End the turn of the run that owns ``owner``, if it has one."""
        self._end(id(owner))

    def _end(self, key: int) -> None:
        with self._lock:
            turn = self._turns.pop(key, None)
            finalizer = self._finalizers.pop(key, None)
        if finalizer is not None:
            finalizer.detach()
        if turn is not None:
            turn.close()

    def close(self) -> None:
        """End every open turn."""
        with self._lock:
            turns, self._turns = list(self._turns.values()), {}
            finalizers, self._finalizers = list(self._finalizers.values()), {}
        for finalizer in finalizers:
            finalizer.detach()
        for turn in turns:
            turn.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._turns)

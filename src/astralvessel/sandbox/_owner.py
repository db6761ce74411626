"""Which process a running sandbox belongs to: the one that started it, never a forked child.

A child forked while a turn is open (``os.fork``, or ``multiprocessing`` with
the ``fork`` start method) inherits the turn's pipes to its sandbox server, but
not the thread that reads the server's answers. A request it sent was answered
to the parent, which took the unknown answer as a broken protocol and ended
its own turn, while the child waited out the call's timeout; a child that
closed the turn (or let a finalizer or a warm pool do it) killed the parent's
sandbox and removed its outbox. So a session remembers its process, refuses
requests from any other, and its ``close`` there only forgets it.
"""

from __future__ import annotations

import os

__all__ = ["Owner"]


class Owner:
    """The process that made this object, so a forked child can tell it is not that process."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def forked(self) -> bool:
        """True in a child forked after this was made: the sandbox is its parent's."""
        return os.getpid() != self.pid

    def refusal(self, what: str) -> str:
        """Why ``what`` cannot be used here, for an error raised in a forked child."""
        return (
            f"{what} belongs to process {self.pid}, which started it; this process "
            f"({os.getpid()}) was forked from it and cannot use its sandbox: open a new "
            "turn here with executor.turn()"
        )

"""Closing: the lifecycle faces of whatever the host closes, written once.

``Executor``, ``Turn``, ``RayExecutor`` and ``RayTurn`` each say what closing
does (``close``); this base gives each of them the same ``aclose`` and the same
``with`` / ``async with`` faces, so the four cannot drift apart.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TypeVar

from .._ground._aio import shielded, to_thread
from ..errors import TurnClosedError

__all__ = ["Closing", "refuse_if_ended"]

_C = TypeVar("_C", bound="Closing")


class Closing(ABC):
    """``close`` given, ``aclose`` and both context-manager faces follow."""

    __slots__ = ()

    @abstractmethod
    def close(self) -> None:
        """Release what the object holds; safe to call more than once."""

    async def aclose(self) -> None:
        """Async twin of ``close``; it finishes even when the caller is being cancelled."""
        # Shielded: under trio, or an anyio scope on asyncio, cancellation is level-triggered,
        # and the ``async with`` a cancel unwinds would otherwise leave the sandbox running.
        with shielded():
            await to_thread(self.close)

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self: _C) -> _C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def refuse_if_ended(closed: bool) -> None:
    """``TurnClosedError`` for a turn that has ended, in the words both turns use."""
    if closed:
        raise TurnClosedError("this turn has ended; open a new one with executor.turn()")

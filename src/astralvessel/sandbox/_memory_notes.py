"""What stopped a call, as the server's ``exit`` frame says it (pure, no I/O): facts, no words.

The frame says what stopped a call, for every kind of call: ``memory``
(``[held, limit]`` in bytes) when the memory watch stopped it, and
``oom_killed`` (with ``oom_limit``, the group's limit then) when the kernel's
OOM killer stopped processes of the turn while it ran. ``memory_stops`` reads
them as ``MemoryStop`` values, which ``results`` words: a tool call's note
ends its output, for the model; an exec's ends its stderr, for the host.

It also says which other bound the call met, with no note (the command saw the
kernel's refusal itself and said what it says): ``processes`` (``[held, limit]``)
when the server saw its processes at their limit, ``disk`` (``[used, size]``)
when it left the workspace full. ``limit_met`` tells the outcome of all three.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._api import MemoryStop

__all__ = ["limit_met", "memory_stops"]


def _count(value: object) -> int | None:
    """``value`` if it is a positive int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def memory_stops(exit_info: Mapping[str, Any], configured_bytes: int) -> tuple[MemoryStop, ...]:
    """What stopped the call for memory: the memory watch, then the kernel; ``()`` if nothing.

    ``configured_bytes`` is the turn's memory group's bound as the host set it, the
    kernel's limit only when the server could not read the one it applied (``oom_limit``).
    """
    stops = []
    memory = exit_info.get("memory")
    if isinstance(memory, list) and len(memory) == 2 and all(_count(n) for n in memory):
        stops.append(MemoryStop(by="watch", held=int(memory[0]), limit=int(memory[1])))
    killed = _count(exit_info.get("oom_killed"))
    if killed is not None:
        bound = _count(exit_info.get("oom_limit")) or configured_bytes
        stops.append(MemoryStop(by="kernel", killed=killed, limit=bound))
    return tuple(stops)


def limit_met(exit_info: Mapping[str, Any]) -> bool:
    """Whether a bound of the turn stopped the call: its memory, processes or disk."""
    return bool(memory_stops(exit_info, 1 << 20)) or any(
        _pair(exit_info.get(bound)) for bound in ("processes", "disk")
    )


def _pair(value: object) -> bool:
    """Whether ``value`` is ``[held, limit]``: two counts, the limit positive."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)
        and value[1] > 0
    )

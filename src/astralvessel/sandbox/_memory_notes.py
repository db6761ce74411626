"""What a call's result says when the turn's memory bound stopped it (pure, no I/O).

The server's ``exit`` frame says what stopped a call, for every kind of call:
``memory`` (``[held, limit]`` in bytes) when the memory watch stopped it, and
``oom_killed`` (with ``oom_limit``, the group's limit then) when the kernel's OOM
killer stopped processes of the turn while it ran. A tool call's note ends its
output, for the model; an exec's ends its stderr, for the host. The wording is
the one ``docs/sandbox-server.md`` gives.

It also says which other bound the call met, with no note (the command saw the
kernel's refusal itself and said what it says): ``processes`` (``[held, limit]``)
when the server saw its processes at their limit, ``disk`` (``[used, size]``)
when it left the workspace full. ``limit_met`` tells the outcome of all three.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, AnyStr

__all__ = ["limit_met", "memory_notes", "memory_stopped", "with_notes"]


def _count(value: object) -> int | None:
    """``value`` if it is a positive int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def memory_notes(exit_info: Mapping[str, Any], configured_bytes: int) -> str:
    """The notes, one line each, for what stopped the call; ``""`` when nothing did.

    ``configured_bytes`` is the turn's memory group's bound as the host set it, stated
    only when the server could not read the limit the kernel applied (``oom_limit``).
    """
    notes = []
    memory = exit_info.get("memory")
    if isinstance(memory, list) and len(memory) == 2 and all(_count(n) for n in memory):
        held, limit = (int(n) >> 20 for n in memory)
        notes.append(
            f"[memory limit: the turn's calls held {held} MiB, more than the {limit} MiB "
            "limit; this call's processes were stopped]\n"
        )
    killed = _count(exit_info.get("oom_killed"))
    if killed is not None:
        bound = _count(exit_info.get("oom_limit")) or configured_bytes
        notes.append(
            f"[memory limit: the kernel stopped {killed} of the turn's processes while this "
            f"call ran; the turn held its whole {bound >> 20} MiB (the calls' memory, the "
            "workspace's files and kernel buffers such as pipes); this call's processes "
            "were stopped]\n"
        )
    return "".join(notes)


def memory_stopped(exit_info: Mapping[str, Any]) -> bool:
    """Whether the memory watch or the kernel's OOM killer stopped the call (a note is due)."""
    return bool(memory_notes(exit_info, 1 << 20))


def limit_met(exit_info: Mapping[str, Any]) -> bool:
    """Whether a bound of the turn stopped the call: its memory, processes or disk."""
    return memory_stopped(exit_info) or any(
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


def with_notes(text: AnyStr, notes: AnyStr) -> AnyStr:
    """``text`` (an output, or an exec's stderr) followed by ``notes`` on lines of their own."""
    newline = notes[-1:]  # every note ends its line: "\n" of the same type as ``text``
    if not notes or not text or text.endswith(newline):
        return text + notes
    return text + newline + notes

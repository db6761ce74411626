"""What every adapter shares: one parsed tool call, and running a batch of them in one turn."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import attrs

from .._ground._aio import gather
from ..errors import UsageError

if TYPE_CHECKING:
    from ..executor import Turn
    from ..results import ToolResult

__all__ = ["ToolCall", "arun_calls", "as_dict", "as_list", "run_calls"]

#: Threads used at most for one batch of sync calls; more calls wait their turn.
MAX_THREADS = 8


@attrs.frozen(kw_only=True)
class ToolCall:
    """One tool call a model asked for: its id in the API, the tool's name and the arguments.

    ``arguments`` is what the API carried: JSON text (OpenAI) or an object
    (Anthropic); the turn parses and checks it either way.
    """

    id: str
    name: str
    arguments: object = None


def as_dict(value: object, what: str) -> Mapping[str, Any]:
    """A plain mapping for ``value``, calling ``model_dump()`` on SDK objects.

    Raises ``UsageError`` for anything else: a response of the wrong shape is the
    host's to fix (an API never sends one), not a call the model can retry.
    """
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        value = dump()
    if not isinstance(value, Mapping):
        raise UsageError(f"expected {what} as a dict, got {type(value).__name__}")
    return value


def as_list(value: object, what: str) -> Sequence[Any]:
    """``value`` as a list of items (``None`` is none), or ``UsageError``."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Sequence):
        raise UsageError(f"expected {what} as a list, got {type(value).__name__}")
    return value


def run_calls(turn: Turn, calls: Sequence[ToolCall]) -> list[ToolResult]:
    """Run ``calls`` in ``turn`` concurrently on threads; results come back in call order."""
    if len(calls) <= 1:
        return [turn.call(c.name, c.arguments) for c in calls]
    with ThreadPoolExecutor(max_workers=min(len(calls), MAX_THREADS)) as pool:
        return list(pool.map(lambda c: turn.call(c.name, c.arguments), calls))


async def arun_calls(turn: Turn, calls: Sequence[ToolCall]) -> list[ToolResult]:
    """Run ``calls`` in ``turn`` concurrently with ``acall``; results come back in call order."""
    return await gather([functools.partial(turn.acall, c.name, c.arguments) for c in calls])

"""What the file views share: checked integer arguments, and file names shown as text.

This module is stdlib only and runs on Python 3.8+, because in a Docker
sandbox it runs on the image's ``python3``.
"""

from __future__ import annotations

from ._paths import _Refusal

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["UNDECODABLE_NOTE"]


def _int_argument(
    arguments: dict[str, Any], name: str, default: int, low: int, high: int | None
) -> int:
    value = arguments.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Refusal(f"{name} must be an integer, not {value!r}.")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise _Refusal(f"{name} must be {bound}; got {value}.")
    return value


def _display(name: str) -> str:
    """A file name as text the model can see, even when it is not valid UTF-8."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


#: Told the model under a listing that shows a name's bytes as U+FFFD: what it can do.
UNDECODABLE_NOTE = (
    "[names shown with \ufffd hold bytes that are not UTF-8, which a tool's arguments cannot "
    "name; reach those files with bash (ls -b shows their bytes as escapes; a shell glob "
    "such as mv caf?.txt new.txt renames one)]"
)


def _noted(lines: list[str]) -> list[str]:
    """``lines`` with ``UNDECODABLE_NOTE`` after them when one shows a replaced byte."""
    return [*lines, UNDECODABLE_NOTE] if any("\ufffd" in line for line in lines) else lines

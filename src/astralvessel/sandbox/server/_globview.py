"""The ``find`` view (the ``glob`` tool): paths under a folder that match a glob, in name order.

Globs are ripgrep's (``*``, ``?``, ``[...]``, ``{a,b}``, ``**``), translated to one
regular expression; the walk never follows a link, skips folders no match can be
under, and stops at the tool's deadline, checked while a folder is read too. A
folder is read only to ``GLOB_SCAN_ENTRIES`` entries, as ``list`` reads one: a
million names take seconds to read and sort. The result says when either bound
cut the search short.

This module is stdlib only and runs on Python 3.8+, because in a Docker
sandbox it runs on the image's ``python3``.
"""

from __future__ import annotations

import os
import posixpath
import time

from ._paths import (
    _O_CLOEXEC,
    FileContext,
    _close,
    _open_directory,
    _path_argument,
    _Refusal,
    _resolve,
)
from ._viewtext import _display, _int_argument, _noted

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

__all__ = ["GLOB_DEFAULT_MAX", "GLOB_MAX", "GLOB_SCAN_ENTRIES", "glob"]

#: ``glob``: default and largest ``max_results``.
GLOB_DEFAULT_MAX = 200
GLOB_MAX = 2000
#: Entries of one folder read at most (a folder with more is searched in those only).
GLOB_SCAN_ENTRIES = 10_000
#: Entries read between two looks at the clock.
_CLOCK_EVERY = 64


def _translate(pattern: str) -> str:
    """A regular expression for a glob over paths: ``*``, ``?``, ``[...]``, ``{a,b}`` and ``**``."""
    import re  # only the worker imports it (see warm)

    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            piece, i = _translate_stars(pattern, i)
        elif c == "?":
            piece, i = "[^/]", i + 1
        elif c == "[":
            piece, i = _translate_class(pattern, i)
        elif c == "{":
            piece, i = _translate_braces(pattern, i)
        elif c == "\\" and i + 1 < len(pattern):
            piece, i = re.escape(pattern[i + 1]), i + 2
        else:
            piece, i = re.escape(c), i + 1
        out.append(piece)
    return "".join(out)


def _translate_stars(pattern: str, i: int) -> tuple[str, int]:
    n = len(pattern)
    j = i
    while j < n and pattern[j] == "*":
        j += 1
    whole_segment = (i == 0 or pattern[i - 1] == "/") and (j == n or pattern[j] == "/")
    if j - i >= 2 and whole_segment:
        # "**" as a whole segment spans any number of directories, including none.
        return (".*", j) if j == n else ("(?:.*/)?", j + 1)
    return "[^/]*", j


def _translate_class(pattern: str, i: int) -> tuple[str, int]:
    import re  # only the worker imports it (see warm)

    n = len(pattern)
    j = i + 1
    if j < n and pattern[j] in "!^":
        j += 1
    if j < n and pattern[j] == "]":
        j += 1
    while j < n and pattern[j] != "]":
        j += 1
    if j >= n:
        return re.escape("["), i + 1
    body = pattern[i + 1 : j]
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    body = body.replace("\\", "\\\\")
    return (f"[^/{body}]" if negate else f"[{body}]"), j + 1


def _translate_braces(pattern: str, i: int) -> tuple[str, int]:
    import re  # only the worker imports it (see warm)

    depth = 0
    parts = []
    start = i + 1
    for j in range(i, len(pattern)):
        c = pattern[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                parts.append(pattern[start:j])
                return "(?:" + "|".join(_translate(part) for part in parts) + ")", j + 1
        elif c == "," and depth == 1:
            parts.append(pattern[start:j])
            start = j + 1
    return re.escape("{"), i + 1


class _Glob:
    """A compiled glob: the full-path match and which directories can still lead to one."""

    def __init__(self, pattern: str) -> None:
        import re  # only the worker imports it (see warm)

        text = pattern
        while text.startswith("./"):
            text = text[2:]
        text = text.rstrip("/")
        if "/" not in text:
            text = "**/" + text
        self.regex = re.compile(_translate(text), re.DOTALL)
        self.segments = text.split("/")
        # A brace alternative holding "/" spans segments: then prune nothing.
        self.prunable = not re.search(r"\{[^}]*/", text)
        self.segment_regexes = [
            None
            if segment == "**" or "**" in segment
            else re.compile(_translate(segment), re.DOTALL)
            for segment in self.segments
        ]

    def matches(self, relative: str) -> bool:
        return self.regex.fullmatch(relative) is not None

    def may_hold_matches(self, parts: list[str]) -> bool:
        """Whether the directory at relative ``parts`` can contain a match."""
        if not self.prunable:
            return True
        for index, part in enumerate(parts):
            if index >= len(self.segments):
                return False
            regex = self.segment_regexes[index]
            if regex is None:
                return True
            if regex.fullmatch(part) is None:
                return False
        return len(parts) < len(self.segments)


def _glob_pattern(arguments: dict[str, Any]) -> str:
    pattern = arguments.get("pattern")
    if not isinstance(pattern, str) or not pattern.strip():
        raise _Refusal("pattern is required: a glob such as *.md or src/**/*.py.")
    if "\x00" in pattern:
        raise _Refusal("pattern must not contain a NUL character.")
    if pattern.startswith("/"):
        raise _Refusal(
            f"pattern {pattern!r} is absolute; give a relative pattern and put the directory "
            "to search from in path."
        )
    if ".." in pattern.split("/"):
        raise _Refusal(
            f"pattern {pattern!r} contains '..'; give the directory to search from in path."
        )
    return pattern


def glob(arguments: dict[str, Any], ctx: FileContext) -> str:
    """The ``find`` view: up to ``max_results`` paths under ``path`` matching ``pattern``."""
    pattern = _glob_pattern(arguments)
    max_results = _int_argument(arguments, "max_results", GLOB_DEFAULT_MAX, 1, GLOB_MAX)
    path = _path_argument(arguments, ctx, required=False)
    given = arguments.get("path")
    shown_base = given if isinstance(given, str) and given else ""
    if shown_base.startswith("/"):
        shown_base = ctx.sandbox_path(shown_base)
    compiled = _Glob(pattern)
    node, parent = _resolve(path, ctx)
    try:
        top = _open_directory(node, path)
    finally:
        _close(node.fd)
        _close(parent.fd)
    found: list[str] = []
    unreadable = 0
    crowded: list[str] = []
    timed_out = False
    for event, relative in _walk(top, compiled, ctx):
        if event == _UNREADABLE:
            unreadable += 1
        elif event == _CROWDED:
            crowded.append(relative)
        elif event == _DEADLINE:
            timed_out = True
            break
        else:
            found.append(relative)
            if len(found) > max_results:
                break
    more = len(found) > max_results
    shown = [_display(_shown_path(shown_base, rel)) for rel in found[:max_results]]
    none = "No files matched" if timed_out or crowded else "No files match"
    lines = _noted(shown) or [f"{none} {pattern!r} under {path}."]
    if more:
        lines.append(
            f"[more than {max_results} files match; showing the first {max_results}: narrow the "
            f"pattern or path, or raise max_results (at most {GLOB_MAX})]"
        )
    if unreadable:
        lines.append(
            f"[{unreadable} director{'y' if unreadable == 1 else 'ies'} could not be read "
            "by the sandbox user and were skipped]"
        )
    if crowded:
        lines.append(_crowded_note(crowded, shown_base))
    if timed_out:
        limit = f"{ctx.timeout:g} s" if ctx.timeout is not None else "its time limit"
        lines.append(
            f"[stopped after {limit}, the tool timeout: the list above is incomplete; "
            "narrow the pattern or path]"
        )
    return "\n".join(lines)


def _shown_path(shown_base: str, relative: str) -> str:
    if not relative:
        return shown_base or "."
    return posixpath.join(shown_base, relative) if shown_base else relative


def _crowded_note(crowded: list[str], shown_base: str) -> str:
    """What the model reads when folders held more entries than a search reads of one."""
    first = _display(_shown_path(shown_base, crowded[0]))
    which = (
        f"folder {first} holds"
        if len(crowded) == 1
        else f"{len(crowded)} folders (the first: {first}) hold"
    )
    was = "was" if len(crowded) == 1 else "were"
    return (
        f"[{which} more than {GLOB_SCAN_ENTRIES} entries and {was} searched only in the first "
        f"{GLOB_SCAN_ENTRIES} read, not to the end: matches in the rest are missing above; "
        "use bash (find) to search such a folder whole]"
    )


#: What ``_walk`` yields, with a relative path: a match, a folder it could not read, a
#: folder read only to ``GLOB_SCAN_ENTRIES``, and the deadline (then it stops).
_MATCH, _UNREADABLE, _CROWDED, _DEADLINE = "match", "unreadable", "crowded", "deadline"


class _PastDeadline(Exception):
    """The tool's deadline passed during the search."""


def _check_clock(count: int, deadline: float | None) -> None:
    """Raise ``_PastDeadline`` if ``deadline`` has passed (looked at every ``_CLOCK_EVERY``)."""
    if deadline is not None and count % _CLOCK_EVERY == 0 and time.monotonic() > deadline:
        raise _PastDeadline


def _sorted_entries(fd: int, deadline: float | None) -> tuple[list[tuple[str, bool]], bool]:
    """A folder's ``(name, is a real directory)`` pairs in name order, read up to
    ``GLOB_SCAN_ENTRIES``, and whether it held more.

    Raises ``_PastDeadline`` once the deadline passes, ``OSError`` if it cannot be read.
    """
    listed: list[tuple[str, bool]] = []
    with os.scandir(fd) as scan:
        for count, entry in enumerate(scan, 1):
            if count > GLOB_SCAN_ENTRIES:
                listed.sort()
                return listed, True
            _check_clock(count, deadline)
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            listed.append((entry.name, is_dir))
    listed.sort()
    return listed, False


def _walk(top: int, compiled: _Glob, ctx: FileContext) -> Iterator[tuple[str, str]]:
    """Yield ``(_MATCH, relative path)`` for each match in name order, depth first.

    Never follows a link: directories are entered with ``O_NOFOLLOW`` relative to
    their parent's descriptor. Also yields ``(_UNREADABLE, path)`` for each
    directory it cannot read, ``(_CROWDED, path)`` for each read only in part,
    and ``(_DEADLINE, "")`` once when the deadline passes, then stops.
    """
    deadline = ctx.deadline
    stack: list[tuple[int, list[str], Iterator[tuple[str, bool]]]] = []
    try:
        yield from _enter(stack, top, [], deadline)
        checked = 0
        while stack:
            fd, parts, iterator = stack[-1]
            item = next(iterator, None)
            if item is None:
                os.close(fd)
                stack.pop()
                continue
            checked += 1
            _check_clock(checked, deadline)
            name, is_dir = item
            child_parts = [*parts, name]
            if is_dir:
                if not compiled.may_hold_matches(child_parts):
                    continue
                try:
                    child = os.open(
                        name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd
                    )
                except OSError:
                    yield _UNREADABLE, "/".join(child_parts)
                    continue
                yield from _enter(stack, child, child_parts, deadline)
                continue
            relative = "/".join(child_parts)
            if compiled.matches(relative):
                yield _MATCH, relative
    except _PastDeadline:
        yield _DEADLINE, ""
    finally:
        for fd, _, _ in stack:
            _close(fd)


def _enter(
    stack: list[tuple[int, list[str], Iterator[tuple[str, bool]]]],
    fd: int,
    parts: list[str],
    deadline: float | None,
) -> Iterator[tuple[str, str]]:
    """Read the open folder ``fd`` and push it on the walk's ``stack`` (which closes it).

    Yields ``_UNREADABLE`` or ``_CROWDED`` for it; raises ``_PastDeadline``.
    """
    try:
        listed, crowded = _sorted_entries(fd, deadline)
    except OSError:
        os.close(fd)
        yield _UNREADABLE, "/".join(parts)
        return
    except BaseException:
        os.close(fd)
        raise
    stack.append((fd, parts, iter(listed)))
    if crowded:
        yield _CROWDED, "/".join(parts)

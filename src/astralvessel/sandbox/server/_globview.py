"""The ``find`` view (the ``glob`` tool): paths under a folder that match a glob, in name order.

Globs are ripgrep's (``*``, ``?``, ``[...]``, ``{a,b}``, ``**``), translated to one
regular expression; the walk never follows a link, skips folders no match can be
under, and stops at the tool's deadline.

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

__all__ = ["GLOB_DEFAULT_MAX", "GLOB_MAX", "glob"]

#: ``glob``: default and largest ``max_results``.
GLOB_DEFAULT_MAX = 200
GLOB_MAX = 2000


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
    timed_out = False
    for relative, error in _walk(top, compiled, ctx):
        if error:
            unreadable += 1
            continue
        if relative is None:
            timed_out = True
            break
        found.append(relative)
        if len(found) > max_results:
            break
    more = len(found) > max_results
    shown = [
        _display(posixpath.join(shown_base, rel) if shown_base else rel)
        for rel in found[:max_results]
    ]
    lines = _noted(shown) or [f"No files match {pattern!r} under {path}."]
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
    if timed_out:
        limit = f"{ctx.timeout:g} s" if ctx.timeout is not None else "its time limit"
        lines.append(
            f"[stopped after {limit}, the tool timeout: the list above is incomplete; "
            "narrow the pattern or path]"
        )
    return "\n".join(lines)


def _sorted_entries(fd: int) -> Iterator[tuple[str, bool]]:
    """A directory's ``(name, is a real directory)`` pairs in name order."""
    listed = []
    with os.scandir(fd) as scan:
        for entry in scan:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            listed.append((entry.name, is_dir))
    listed.sort()
    return iter(listed)


def _walk(top: int, compiled: _Glob, ctx: FileContext) -> Iterator[tuple[str | None, bool]]:
    """Yield ``(relative path, False)`` for each match in name order, depth first.

    Never follows a link: directories are entered with ``O_NOFOLLOW`` relative to
    their parent's descriptor. Yields ``(None, True)`` for each directory it
    cannot read and ``(None, False)`` once when the deadline passes, then stops.
    """
    deadline = ctx.deadline
    stack: list[tuple[int, list[str], Iterator[tuple[str, bool]]]] = []

    try:
        stack.append((top, [], _sorted_entries(top)))
    except OSError:
        os.close(top)
        yield None, True
        return
    checked = 0
    try:
        while stack:
            fd, parts, iterator = stack[-1]
            item = next(iterator, None)
            if item is None:
                os.close(fd)
                stack.pop()
                continue
            checked += 1
            if deadline is not None and checked % 64 == 0 and time.monotonic() > deadline:
                yield None, False
                return
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
                    yield None, True
                    continue
                try:
                    stack.append((child, child_parts, _sorted_entries(child)))
                except OSError:
                    os.close(child)
                    yield None, True
                continue
            relative = "/".join(child_parts)
            if compiled.matches(relative):
                yield relative, False
    finally:
        for fd, _, _ in stack:
            _close(fd)

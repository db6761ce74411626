"""The views behind the file tools ``read``, ``glob`` and ``list``, in the sandbox's own view.

A *view* is the text a model is shown of the sandbox's files: ``lines`` (a
numbered range of a text file; the ``read`` tool), ``find`` (paths matching a
glob; ``glob``) and ``entries`` (a folder's entries; ``list``). The session
asks for a view by that name, never by a tool's: which tool shows which view
is the built-ins' business (``builtins.py``).

The sandbox server's unprivileged file worker calls ``handle``. It runs inside
the sandbox as the sandbox's user (or, for the unconfined backend, on the host
with ``path_map`` translating sandbox paths), so the kernel's permission checks
are the sandbox user's: nothing here can show a file that user could not read.

Every path resolves through ``_paths``, one component at a time, never letting the
kernel follow a link.

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
    _child_path,
    _close,
    _open_directory,
    _open_for_reading,
    _os_refusal,
    _path_argument,
    _Refusal,
    _resolve,
)

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

__all__ = ["BINARY_PROBE_BYTES", "VIEWS", "FileContext", "handle", "warm"]


def warm() -> None:
    """Import what the file tools use beyond the server's own modules, before dropping.

    ``re`` (for glob) costs the server's start-up milliseconds it does not need, so
    only the worker imports it, and before it becomes the call's user, which may not
    be able to read the interpreter's library.
    """
    import re  # noqa: F401 - see above


#: ``read``: default and largest ``limit``, default ``offset``, longest line shown whole.
READ_DEFAULT_LIMIT = 400
READ_MAX_LIMIT = 2000
READ_DEFAULT_OFFSET = 1
READ_MAX_LINE_CHARS = 4000
#: The most characters of one file tool's answer (even escaped, its frame stays under 1 MiB).
MAX_RESULT_CHARS = 100_000
#: ``glob``: default and largest ``max_results``.
GLOB_DEFAULT_MAX = 200
GLOB_MAX = 2000
#: ``list``: entries shown at most, and read at most (a folder with more is not read whole).
LIST_MAX_ENTRIES = 500
LIST_SCAN_ENTRIES = 10_000
#: A file with a NUL byte in its first 8 KiB is binary.
BINARY_PROBE_BYTES = 8192

TRUNCATED_MARK = " [line truncated]"

_CHUNK = 1 << 17
# Bytes read of one line before it is known to be over the character cap (UTF-8 is at
# most 4 bytes a character, and an invalid byte decodes to one character).
_LINE_BYTES = READ_MAX_LINE_CHARS * 4 + 4


def handle(view: str, arguments: dict[str, Any], ctx: FileContext) -> tuple[str, bool]:
    """Render the view ``lines``, ``find`` or ``entries``: ``(text, is_error)``, never
    raising for bad input.

    ``ctx`` may be a ``FileContext`` or any object with its attributes.
    """
    ctx = FileContext.coerce(ctx)
    render = VIEWS.get(view)
    if render is None:
        return f"{view!r} is not a view; the views are {', '.join(sorted(VIEWS))}.", True
    try:
        return _fit(render(arguments, ctx)), False
    except _Refusal as refusal:
        return _fit(str(refusal)), True


def _fit(text: str) -> str:
    """Cut ``text`` to ``MAX_RESULT_CHARS``, so its frame stays far below the 1 MiB header bound.

    A read of 2000 lines of 4000 characters is 8 million characters: more than any
    frame header may carry, and far more than any model is shown.
    """
    if len(text) <= MAX_RESULT_CHARS:
        return text
    dropped = len(text) - MAX_RESULT_CHARS
    return text[:MAX_RESULT_CHARS] + f"\n[file tool output cut: {dropped} more characters]\n"


# -- arguments ----------------------------------------------------------------------------


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


# -- read -----------------------------------------------------------------------------------


class _Lines:
    """A file's lines, read in large chunks so that skipping lines is only a scan for newlines."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self._eof = False

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = os.read(self._fd, _CHUNK)
        if not chunk:
            self._eof = True
            return False
        self._buffer += chunk
        return True

    def skip(self, count: int) -> int:
        """Skip up to ``count`` lines without keeping them; return how many there were."""
        skipped = 0
        # Whether the bytes dropped last ended inside a line: at the end of the file that
        # unterminated last line still counts as one.
        partial = False
        if self._buffer:
            newlines = self._buffer.count(b"\n")
            if newlines >= count:
                self._buffer = self._buffer[_nth_newline(self._buffer, count, len(self._buffer)) :]
                return count
            skipped = newlines
            partial = not self._buffer.endswith(b"\n")
            self._buffer = b""
        # Read into one reused buffer: no allocation per chunk, and memchr (find) skips
        # newline-free stretches, such as a huge line, at memory speed.
        scratch = bytearray(_CHUNK)
        while skipped < count and not self._eof:
            size = os.readv(self._fd, [scratch])
            if not size:
                self._eof = True
                break
            if scratch.find(b"\n", 0, size) < 0:
                partial = True
                continue
            newlines = scratch.count(b"\n", 0, size)
            if skipped + newlines >= count:
                self._buffer = bytes(scratch[_nth_newline(scratch, count - skipped, size) : size])
                return count
            skipped += newlines
            partial = scratch[size - 1] != 0x0A
        return skipped + (1 if partial and skipped < count else 0)

    def at_end(self) -> bool:
        """Whether no further line follows."""
        return not self._buffer and not self._fill()

    def line(self, cap: int) -> tuple[bytes, bool] | None:
        """The next line (without its newline), at most ``cap`` bytes, and whether it was longer."""
        while b"\n" not in self._buffer[: cap + 1] and len(self._buffer) <= cap:
            if not self._fill():
                break
        if not self._buffer:
            return None
        end = self._buffer.find(b"\n", 0, cap + 1)
        if end >= 0:
            text, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
            return text, False
        if len(self._buffer) <= cap:
            text, self._buffer = self._buffer, b""
            return text, False
        # Longer than the cap: keep the head, then drop the rest of the line unread into memory.
        text = self._buffer[:cap]
        self._buffer = self._buffer[cap:]
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                self._buffer = self._buffer[end + 1 :]
                break
            self._buffer = b""
            if not self._fill():
                break
        return text, True


def _nth_newline(data: bytes | bytearray, n: int, end: int) -> int:
    """The index just past the ``n``-th newline in ``data[:end]`` (which holds at least ``n``)."""
    position = -1
    for _ in range(n):
        position = data.index(b"\n", position + 1, end)
    return position + 1


def _render_line(raw: bytes, longer: bool) -> str:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    text = raw.decode("utf-8", "replace")
    if longer or len(text) > READ_MAX_LINE_CHARS:
        return text[:READ_MAX_LINE_CHARS] + TRUNCATED_MARK
    return text


def _read(arguments: dict[str, Any], ctx: FileContext) -> str:
    path = _path_argument(arguments, ctx, required=True)
    offset = _int_argument(arguments, "offset", READ_DEFAULT_OFFSET, 1, None)
    limit = _int_argument(arguments, "limit", READ_DEFAULT_LIMIT, 1, READ_MAX_LIMIT)
    node, parent = _resolve(path, ctx)
    try:
        fd = _open_for_reading(node, parent, path)
    finally:
        _close(node.fd)
        _close(parent.fd)
    try:
        return _read_lines(fd, path, offset, limit)
    except OSError as error:
        raise _os_refusal(error, path, path) from None
    finally:
        os.close(fd)


def _read_lines(fd: int, path: str, offset: int, limit: int) -> str:
    head = os.pread(fd, BINARY_PROBE_BYTES, 0)
    if b"\x00" in head:
        raise _Refusal(f"{path} is a binary file; read shows text files only.")
    lines = _Lines(fd)
    skipped = lines.skip(offset - 1)
    out: list[str] = []
    number = offset
    while len(out) < limit:
        got = lines.line(_LINE_BYTES)
        if got is None:
            break
        out.append(f"{number}\t{_render_line(*got)}")
        number += 1
    if not out:
        if offset == 1:
            return f"[{path} is empty]"
        total = skipped
        raise _Refusal(
            f"offset {offset} is past the end of {path}, which has {total} "
            f"line{'' if total == 1 else 's'}; use an offset from 1 to {max(total, 1)}."
        )
    if not lines.at_end():
        out.append(f"[more lines follow; call read with offset={number} to continue]")
    return "\n".join(out)


# -- list -----------------------------------------------------------------------------------


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


def _links_to_directory(path: str, ctx: FileContext) -> bool:
    """Whether a link at ``path`` leads, within the visible roots, to a directory."""
    try:
        node, parent = _resolve(path, ctx)
    except _Refusal:
        return False
    _close(node.fd)
    _close(parent.fd)
    return node.is_dir


def _list(arguments: dict[str, Any], ctx: FileContext) -> str:
    path = _path_argument(arguments, ctx, required=False)
    node, parent = _resolve(path, ctx)
    try:
        fd = _open_directory(node, path)
    finally:
        _close(node.fd)
        _close(parent.fd)
    try:
        directories, files, stop = _scan(fd, node.path, ctx)
    except OSError as error:
        raise _os_refusal(error, path, path) from None
    finally:
        os.close(fd)
    # In the unconfined mode a mount may sit inside another without a directory for it on the host.
    for key in ctx.path_map:
        if posixpath.dirname(key) == node.path:
            name = posixpath.basename(key)
            if name not in directories:
                directories.append(name)
                if name in files:
                    files.remove(name)
    entries_shown = [d + "/" for d in sorted(directories)] + sorted(files)
    if not entries_shown and stop is None:
        return f"[{path} is empty]"
    lines = _noted(entries_shown[:LIST_MAX_ENTRIES])
    left_out = max(0, len(entries_shown) - LIST_MAX_ENTRIES)
    if stop is not None:
        lines.append(_LIST_STOPS[stop](ctx))
    elif left_out:
        lines.append(
            f"[{left_out} more entr{'y' if left_out == 1 else 'ies'} not shown: "
            f"only the first {LIST_MAX_ENTRIES} are listed; use glob to find specific files]"
        )
    return "\n".join(lines)


def _scan(fd: int, at: str, ctx: FileContext) -> tuple[list[str], list[str], str | None]:
    """The folder's directories and other entries, read up to ``LIST_SCAN_ENTRIES`` and
    the deadline, and why the reading stopped early (``None`` if it read them all).

    Reading a million names costs seconds and the model is shown 500 of them, so the
    scan stops at a bound that still sorts any ordinary folder whole.
    """
    deadline = ctx.deadline
    directories: list[str] = []
    files: list[str] = []
    with os.scandir(fd) as entries:
        for count, entry in enumerate(entries, 1):
            if count > LIST_SCAN_ENTRIES:
                return directories, files, "more"
            if deadline is not None and count % 64 == 0 and time.monotonic() > deadline:
                return directories, files, "deadline"
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                if not is_dir and entry.is_symlink():
                    # Shown by what it leads to, and only when that is within the agent's data.
                    is_dir = _links_to_directory(_child_path(at, entry.name), ctx)
            except OSError:
                is_dir = False
            (directories if is_dir else files).append(_display(entry.name))
    return directories, files, None


def _past_the_scan(ctx: FileContext) -> str:
    return (
        f"[this folder holds more than {LIST_SCAN_ENTRIES} entries and was not read to the end: "
        f"those above are the first {LIST_MAX_ENTRIES} in name order of the first "
        f"{LIST_SCAN_ENTRIES} read, not of the whole folder; use glob to find specific files, "
        "or bash (ls | wc -l counts them)]"
    )


def _past_the_deadline(ctx: FileContext) -> str:
    limit = f"{ctx.timeout:g} s" if ctx.timeout is not None else "its time limit"
    return (
        f"[stopped after {limit}, the tool timeout, before the folder was read to the end: "
        "the list above is incomplete; use glob to find specific files]"
    )


#: The note under a listing whose folder was not read to the end, by why it stopped.
_LIST_STOPS = {"more": _past_the_scan, "deadline": _past_the_deadline}


# -- glob -----------------------------------------------------------------------------------


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


def _glob(arguments: dict[str, Any], ctx: FileContext) -> str:
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


#: Each view by name: what the session asks for (the built-ins pick one per tool).
VIEWS = {"lines": _read, "find": _glob, "entries": _list}

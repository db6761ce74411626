"""The ``lines`` view (the ``read`` tool): a numbered range of a text file's lines.

A file is read in large chunks, so skipping to a far offset is only a scan for
newlines, and a line of gigabytes costs its first ``READ_MAX_LINE_CHARS``.

This module is stdlib only and runs on Python 3.8+, because in a Docker
sandbox it runs on the image's ``python3``.
"""

from __future__ import annotations

import os

from ._paths import (
    FileContext,
    _close,
    _open_for_reading,
    _os_refusal,
    _path_argument,
    _Refusal,
    _resolve,
)
from ._viewtext import _int_argument

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "BINARY_PROBE_BYTES",
    "READ_DEFAULT_LIMIT",
    "READ_DEFAULT_OFFSET",
    "READ_MAX_LIMIT",
    "READ_MAX_LINE_CHARS",
    "TRUNCATED_MARK",
    "read",
]

#: ``read``: default and largest ``limit``, default ``offset``, longest line shown whole.
READ_DEFAULT_LIMIT = 400
READ_MAX_LIMIT = 2000
READ_DEFAULT_OFFSET = 1
READ_MAX_LINE_CHARS = 4000
#: A file with a NUL byte in its first 8 KiB is binary.
BINARY_PROBE_BYTES = 8192

TRUNCATED_MARK = " [line truncated]"

_CHUNK = 1 << 17
# Bytes read of one line before it is known to be over the character cap (UTF-8 is at
# most 4 bytes a character, and an invalid byte decodes to one character).
_LINE_BYTES = READ_MAX_LINE_CHARS * 4 + 4


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


def read(arguments: dict[str, Any], ctx: FileContext) -> str:
    """The ``lines`` view: ``limit`` lines of the file at ``path`` from line ``offset``."""
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

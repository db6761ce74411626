"""The ``entries`` view (the ``list`` tool): a folder's entries, folders first, in name order.

A folder is read only to ``LIST_SCAN_ENTRIES`` entries and to the tool's
deadline: a million names take seconds to read, and the model is shown 500.

This module is stdlib only and runs on Python 3.8+, because in a Docker
sandbox it runs on the image's ``python3``.
"""

from __future__ import annotations

import os
import posixpath
import time

from ._paths import (
    FileContext,
    _child_path,
    _close,
    _open_directory,
    _os_refusal,
    _path_argument,
    _Refusal,
    _resolve,
)
from ._viewtext import _display, _noted

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["LIST_MAX_ENTRIES", "LIST_SCAN_ENTRIES", "entries"]

#: ``list``: entries shown at most, and read at most (a folder with more is not read whole).
LIST_MAX_ENTRIES = 500
LIST_SCAN_ENTRIES = 10_000


def _links_to_directory(path: str, ctx: FileContext) -> bool:
    """Whether a link at ``path`` leads, within the visible roots, to a directory."""
    try:
        node, parent = _resolve(path, ctx)
    except _Refusal:
        return False
    _close(node.fd)
    _close(parent.fd)
    return node.is_dir


def entries(arguments: dict[str, Any], ctx: FileContext) -> str:
    """The ``entries`` view: the folder at ``path``, up to ``LIST_MAX_ENTRIES`` entries."""
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

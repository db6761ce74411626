"""The views behind the file tools ``read``, ``glob`` and ``list``, in the sandbox's own view.

A *view* is the text a model is shown of the sandbox's files: ``lines`` (a
numbered range of a text file; the ``read`` tool), ``find`` (paths matching a
glob; ``glob``) and ``entries`` (a folder's entries; ``list``). The session
asks for a view by that name, never by a tool's: which tool shows which view
is the built-ins' business (``builtins.py``).

Each view is a module of its own (``_readview``, ``_globview``, ``_listview``,
sharing ``_viewtext``); this one picks the view by name and bounds its text.

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

from ._globview import GLOB_DEFAULT_MAX, GLOB_MAX, GLOB_SCAN_ENTRIES, glob
from ._listview import LIST_MAX_ENTRIES, LIST_SCAN_ENTRIES, entries
from ._paths import FileContext, _Refusal
from ._readview import (
    BINARY_PROBE_BYTES,
    READ_DEFAULT_LIMIT,
    READ_DEFAULT_OFFSET,
    READ_MAX_LIMIT,
    READ_MAX_LINE_CHARS,
    TRUNCATED_MARK,
    read,
)
from ._viewtext import UNDECODABLE_NOTE

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The views' limits are the built-ins' (their descriptions quote them): named here, once.
__all__ = [
    "BINARY_PROBE_BYTES",
    "GLOB_DEFAULT_MAX",
    "GLOB_MAX",
    "GLOB_SCAN_ENTRIES",
    "LIST_MAX_ENTRIES",
    "LIST_SCAN_ENTRIES",
    "MAX_RESULT_CHARS",
    "READ_DEFAULT_LIMIT",
    "READ_DEFAULT_OFFSET",
    "READ_MAX_LIMIT",
    "READ_MAX_LINE_CHARS",
    "TRUNCATED_MARK",
    "UNDECODABLE_NOTE",
    "VIEWS",
    "FileContext",
    "handle",
    "warm",
]


def warm() -> None:
    """Import what the file tools use beyond the server's own modules, before dropping.

    ``re`` (for glob) costs the server's start-up milliseconds it does not need, so
    only the worker imports it, and before it becomes the call's user, which may not
    be able to read the interpreter's library.
    """
    import re  # noqa: F401 - see above


#: The most characters of one file tool's answer (even escaped, its frame stays under 1 MiB).
MAX_RESULT_CHARS = 100_000


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


#: Each view by name: what the session asks for (the built-ins pick one per tool).
VIEWS = {"lines": read, "find": glob, "entries": entries}

"""The ``grep`` built-in over a fake turn's files, printing what the sandbox's script prints.

A real turn runs ``builtins.GREP_SCRIPT`` (ripgrep, or grep -rnE) in the
sandbox. A fake turn runs nothing, so this module searches the same files the
fake's file tools show and writes the script's output: ``path:line:text`` in
ripgrep's path order, hidden files included, binary files and links inside
directories skipped, the ``[more than N matching lines ...]`` line, and the
script's messages and exit codes for a path outside the agent's data, a
missing path, a binary file and a bad pattern. Patterns are Python regular
expressions, which agree with ripgrep's on everything a test is likely to
use; the message for a bad pattern quotes Python's reason, not ripgrep's.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..builtins import GREP_LINE_COLUMNS, GREP_MAX
from ..sandbox.server._files import BINARY_PROBE_BYTES

__all__ = ["fake_grep"]

# The script cuts every line at 4 bytes a column (cut -b) before the host cuts columns.
_LINE_BYTES = 4 * GREP_LINE_COLUMNS


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _order(rel: str) -> bytes:
    # ripgrep's --sort path: a byte sort of the paths with '/' below every other byte.
    return rel.encode("utf-8", "surrogateescape").replace(b"/", b"\x01")


def _files_under(real: str) -> Iterator[str]:
    """Relative paths of the regular files under ``real``, never following a link."""
    for top, dirs, names in os.walk(real, followlinks=False):
        for name in names:
            full = os.path.join(top, name)
            if os.path.isfile(full) and not os.path.islink(full):
                yield os.path.relpath(full, real)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]


def _glob_filter(glob: str) -> Callable[[str], bool]:
    if not glob:
        return lambda rel: True
    if "/" in glob:
        return lambda rel: fnmatch.fnmatchcase(rel, glob)
    return lambda rel: fnmatch.fnmatchcase(posixpath.basename(rel), glob)


def _matches(shown: str, data: bytes, regex: re.Pattern[str]) -> Iterator[str]:
    lines = data.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if regex.search(line):
            text = f"{shown}:{number}:{line}".encode()[:_LINE_BYTES]
            yield text.decode("utf-8", "replace")


def _refusal(path: str, target: str, real: str, roots: Sequence[str]) -> str | None:
    """The script's message for a path it will not search, or None."""
    if not any(_under(target, root) for root in roots):
        return f"{path} is outside the agent's data. grep can search only {', '.join(roots)}.\n"
    if not os.path.exists(real):
        return f"{path} does not exist.\n"
    if os.path.isfile(real):
        with open(real, "rb") as handle:
            if b"\0" in handle.read(BINARY_PROBE_BYTES):
                return f"{path} is a binary file; grep searches text files only.\n"
    elif not os.path.isdir(real):
        return f"{path} is not a regular file or a directory.\n"
    return None


def _search(path: str, real: str, glob: str, regex: re.Pattern[str], max_results: int) -> list[str]:
    """Matching lines in ripgrep's order, one more than ``max_results`` at most."""
    if os.path.isfile(real):
        found = [(path, real)]
    else:
        keep = _glob_filter(glob)
        found = [
            (f"{path}/{rel}", os.path.join(real, rel))
            for rel in sorted(_files_under(real), key=_order)
            if keep(rel)
        ]
    lines: list[str] = []
    for shown, file in found:
        with open(file, "rb") as handle:
            data = handle.read()
        if file != real and b"\0" in data:
            continue  # a binary file met inside a directory is skipped, as ripgrep does
        lines += _matches(shown, data, regex)
        if len(lines) > max_results:
            break
    return lines


def fake_grep(
    arguments: Mapping[str, Any],
    *,
    workdir: str,
    roots: Sequence[str],
    real_path: Callable[[str], str],
) -> tuple[str, int]:
    """The output and exit code of one ``grep`` call over the files ``real_path`` shows."""
    pattern = str(arguments.get("pattern", ""))
    path = str(arguments.get("path") or ".")
    max_results = min(max(int(arguments.get("max_results") or 100), 1), GREP_MAX)
    target = posixpath.normpath(posixpath.join(workdir, path))
    real = real_path(target)
    refusal = _refusal(path, target, real, roots)
    if refusal is not None:
        return refusal, 2
    try:
        regex = re.compile(pattern, re.IGNORECASE if arguments.get("ignore_case") else 0)
    except re.error as exc:
        return f"Invalid pattern {pattern}: {exc}\n", 2
    lines = _search(path, real, str(arguments.get("glob") or ""), regex, max_results)
    if not lines:
        return "", 1
    if len(lines) > max_results:
        return (
            "\n".join(lines[:max_results])
            + f"\n[more than {max_results} matching lines; showing the first {max_results}: "
            f"narrow the pattern, path or glob, or raise max_results (at most {GREP_MAX})]\n",
            0,
        )
    return "\n".join(lines) + "\n", 0

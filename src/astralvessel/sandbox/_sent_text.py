"""Code a sandbox runs before the server's own: a real module's function, sent as its text.

The bootstraps (``_boot_server``, ``docker/_boot_view``, ``docker/_boot_connect``)
are modules the linters and the type checker read. What a sandbox's Python
receives in its ``python -c`` is one function cut from such a module's source as
it stands (``function_text``), with the kernel's numbers the function names
written in (``with_numbers``): cutting the source, rather than importing it,
keeps the text the same on every host and lets it run on the sandbox's own
Python, whatever its version.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources

__all__ = ["function_text", "with_numbers"]


def function_text(package: str, module: str, name: str) -> str:
    """The source of top-level function ``name`` of ``package.module``, as it stands.

    It begins with a blank line and runs to the last line of the function's
    body: a top-level statement ends it. Raises ``ValueError`` if the module
    has no such function.
    """
    source = resources.files(package).joinpath(f"{module}.py").read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    start = f"def {name}("
    try:
        first = next(i for i, line in enumerate(lines) if line.startswith(start))
    except StopIteration:
        raise ValueError(f"{module} has no top-level function {name}") from None
    end = first + 1
    while end < len(lines) and not (lines[end].strip() and not lines[end][0].isspace()):
        end += 1
    return "\n" + "".join(lines[first:end]).rstrip("\n") + "\n"


def with_numbers(text: str, numbers: Mapping[str, int]) -> str:
    """``text`` with each whole word that is a key of ``numbers`` replaced by its value.

    A sent function names the constants its module imports (defined once, where
    the server or the host also uses them); sent alone, it gets their values.
    """
    if not numbers:
        return text
    words = re.compile(r"\b(" + "|".join(map(re.escape, numbers)) + r")\b")
    return words.sub(lambda match: str(numbers[match.group(1)]), text)

"""The text of the code a Docker server's container runs before the server: from real modules.

``_boot_connect`` and ``_boot_view`` are modules the linters and the type
checker read; what the engine receives in the server's ``python -c`` is each
one's function, cut from its source as it stands (``function_text``), with
the descriptor numbers the host also needs written in. Cutting the source,
rather than importing it, keeps the text the same on every host and lets the
function run on the image's own Python, whatever its version.
"""

from __future__ import annotations

from importlib import resources

from ._boot_view import MEMORY_EVENTS_FD, MEMORY_LIMIT_FD

__all__ = ["CONNECT_BOOTSTRAP", "USERNS_BOOTSTRAP", "function_text"]


def function_text(module: str, name: str) -> str:
    """The source of top-level function ``name`` of ``module`` (in this package), as it stands.

    It begins with a blank line and runs to the last line of the function's
    body: a top-level statement ends it. Raises ``ValueError`` if the module
    has no such function.
    """
    source = resources.files(__package__).joinpath(f"{module}.py").read_text(encoding="utf-8")
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


#: With a direct channel, runs first of all: the server's stdin and stdout become one
#: unix socket to the host (``_boot_connect``).
CONNECT_BOOTSTRAP = function_text("_boot_connect", "_astralvessel_connect")
#: Runs first in the container's own process, before the server's code: its user
#: namespace and the sandbox's view (``_boot_view``; the turn's binds are filled in by
#: ``_spec.server_argv``).
USERNS_BOOTSTRAP = (
    function_text("_boot_view", "_astralvessel_view")
    .replace("MEMORY_EVENTS_FD", str(MEMORY_EVENTS_FD))
    .replace("MEMORY_LIMIT_FD", str(MEMORY_LIMIT_FD))
)

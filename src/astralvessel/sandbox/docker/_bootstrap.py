"""The text of the code a Docker server's container runs before the server: from real modules.

``_boot_connect`` and ``_boot_view`` are modules the linters and the type
checker read; what the engine receives in the server's ``python -c`` is each
one's function, cut from its source as it stands (``function_text``), with
the numbers it names written in (``VIEW_NUMBERS``). Cutting the source,
rather than importing it, keeps the text the same on every host and lets the
function run on the image's own Python, whatever its version.
"""

from __future__ import annotations

from .. import _sent_text
from . import _boot_view

__all__ = ["CONNECT_BOOTSTRAP", "USERNS_BOOTSTRAP", "VIEW_NUMBERS", "function_text"]


def function_text(module: str, name: str) -> str:
    """The source of top-level function ``name`` of ``module`` (in this package), as it stands
    (``_sent_text.function_text``)."""
    return _sent_text.function_text(__name__.rpartition(".")[0], module, name)


#: The numbers ``_astralvessel_view`` names, by name: the descriptors the host reads too,
#: and the kernel's, each defined once (in ``sandbox/server/`` and ``sandbox/_seccomp/``)
#: and imported by ``_boot_view`` for the linters; the text sent carries their values.
VIEW_NUMBERS = {name: int(getattr(_boot_view, name)) for name in _boot_view.SENT_NUMBERS}

#: With a direct channel, runs first of all: the server's stdin and stdout become one
#: unix socket to the host (``_boot_connect``).
CONNECT_BOOTSTRAP = function_text("_boot_connect", "_astralvessel_connect")
#: Runs first in the container's own process, before the server's code: its user
#: namespace and the sandbox's view (``_boot_view``; the turn's binds are filled in by
#: ``_spec.server_argv``).
USERNS_BOOTSTRAP = _sent_text.with_numbers(
    function_text("_boot_view", "_astralvessel_view"), VIEW_NUMBERS
)

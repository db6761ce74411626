"""The small enums every layer names: scopes, input modes and tool kinds.

They sit below ``builtins`` and ``spec`` so that the built-in table can name
its scopes and ``spec`` can read the built-in names from that table, without
either importing the other. ``astralvessel.spec`` re-exports them.
"""

from __future__ import annotations

import enum

from ..errors import UsageError
from ._suggest import unknown_name

__all__ = ["ALL_SCOPES", "InputMode", "Scope", "TextEnum", "ToolKind"]


class TextEnum(str, enum.Enum):
    """A string enum that prints as its value (``str(Scope.READ)`` is ``"tools:read"``),
    as the model, ``vessel.toml`` and the logs spell it."""

    def __str__(self) -> str:
        return str(self.value)


class Scope(TextEnum):
    """A permission scope; the host grants scopes to an executor."""

    READ = "tools:read"
    FILES = "tools:files"
    SEARCH = "tools:search"
    EXECUTE = "tools:execute"

    @classmethod
    def parse(cls, text: str) -> Scope:
        """Return the scope named ``text``, or raise ``UsageError`` listing the known ones."""
        try:
            return cls(text)
        except ValueError:
            raise UsageError(unknown_name("scope", text, [s.value for s in cls])) from None


#: Every scope, granted when neither the host nor vessel.toml narrows them.
ALL_SCOPES: frozenset[Scope] = frozenset(Scope)


class InputMode(TextEnum):
    """How a declared command receives its arguments."""

    JSON_STDIN = "json-stdin"
    ARGS = "args"


class ToolKind(str, enum.Enum):
    """Where a tool runs."""

    COMMAND = "command"  # a declared command, confined in the turn's sandbox
    SERVICE = "service"  # an HTTP POST to a [services] entry, or a bound Python callable
    BUILTIN = "builtin"  # one of the built-ins (astralvessel.builtins.BUILTINS)
    PYTHON = "python"  # a host-process Python function registered with Registry.tool

"""Which tool a confined call belongs to, read back from what the sandbox received (pure).

A fake sandbox sits below the executor's runners, where a call is only an argv
and its stdin, exactly as a real sandbox sees it. The tool is recovered from
the same facts a real command has: the ``grep`` built-in by its script, a
declared tool by its command (``{package}`` filled in), ``bash`` by its
``/bin/sh -c`` line. The arguments are what the command received: the JSON
object on stdin, or, for ``input = "args"``, each ``--name=value`` flag as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .._ground._kinds import InputMode, ToolKind
from ..builtins import GREP_SCRIPT
from ..sandbox._policy import AGENT_DIR
from ..spec import ToolSpec

__all__ = ["Identified", "identify"]

# The positional parameters GREP_SCRIPT takes after "$0", in order (see builtins.grep_request).
_GREP_FIELDS = ("pattern", "path", "glob", "icase", "max_results")


@attrs.frozen(kw_only=True)
class Identified:
    """The tools an argv may belong to (more than one only if their commands are identical)."""

    tools: tuple[str, ...]
    arguments: Mapping[str, Any]


def _command(spec: ToolSpec) -> tuple[str, ...]:
    return tuple(part.replace("{package}", str(AGENT_DIR)) for part in spec.command or ())


def _grep_arguments(argv: tuple[str, ...]) -> dict[str, Any]:
    values = dict(zip(_GREP_FIELDS, argv[4:9], strict=False))
    arguments: dict[str, Any] = {"pattern": values.get("pattern", "")}
    if values.get("path", ".") != ".":
        arguments["path"] = values["path"]
    if values.get("glob"):
        arguments["glob"] = values["glob"]
    if values.get("icase"):
        arguments["ignore_case"] = True
    arguments["max_results"] = int(values.get("max_results") or 0)
    return arguments


def _flags(spec: ToolSpec, rest: tuple[str, ...]) -> dict[str, str] | None:
    """``--name=value`` flags of the spec's properties, or None if ``rest`` is not that."""
    names = set(spec.property_names)
    flags: dict[str, str] = {}
    for flag in rest:
        name, eq, value = flag.removeprefix("--").partition("=")
        if not flag.startswith("--") or not eq or name not in names:
            return None
        flags[name] = value
    return flags


def _declared(specs: Iterable[ToolSpec], argv: tuple[str, ...], stdin: bytes) -> Identified | None:
    matches: list[str] = []
    arguments: Mapping[str, Any] = {}
    for spec in specs:
        if spec.kind is not ToolKind.COMMAND:
            continue
        command = _command(spec)
        if argv[: len(command)] != command:
            continue
        if spec.input is InputMode.ARGS:
            flags = _flags(spec, argv[len(command) :])
            if flags is None:
                continue
            matches.append(spec.name)
            arguments = flags
        elif len(argv) == len(command):
            matches.append(spec.name)
            arguments = _stdin_object(stdin)
    return Identified(tools=tuple(matches), arguments=arguments) if matches else None


def _stdin_object(stdin: bytes) -> Mapping[str, Any]:
    try:
        value = json.loads(stdin.decode("utf-8")) if stdin else {}
    except (UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def identify(specs: Iterable[ToolSpec], argv: tuple[str, ...], stdin: bytes) -> Identified | None:
    """The tool(s) ``argv`` runs and the arguments it received; None if it is none of them.

    Declared tools come first: a declared command may itself be ``/bin/sh -c ...``.
    """
    if argv[:3] == ("/bin/sh", "-c", GREP_SCRIPT):
        return Identified(tools=("grep",), arguments=_grep_arguments(argv))
    declared = _declared(specs, argv, stdin)
    if declared is not None:
        return declared
    if len(argv) == 3 and argv[:2] == ("/bin/sh", "-c"):
        return Identified(tools=("bash",), arguments={"command": argv[2]})
    return None

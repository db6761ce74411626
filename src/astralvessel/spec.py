"""ToolSpec: one tool the model may call, and how a declared tool file becomes one."""

from __future__ import annotations

import copy
import enum
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import jsonschema

from ._convert import converter, describe_errors

__all__ = [
    "BUILTIN_NAMES",
    "InputMode",
    "Scope",
    "ToolKind",
    "ToolSpec",
]

#: The built-in tools' names; no declared or host tool may take one.
BUILTIN_NAMES: tuple[str, ...] = ("read", "grep", "glob", "list", "bash", "webfetch", "websearch")

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_EMPTY_OBJECT: Mapping[str, Any] = {"type": "object", "properties": {}}


class Scope(str, enum.Enum):
    """A permission scope; the host grants scopes to an executor."""

    READ = "tools:read"
    FILES = "tools:files"
    SEARCH = "tools:search"
    EXECUTE = "tools:execute"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> Scope:
        """Return the scope named ``text``, or raise ValueError listing the known ones."""
        try:
            return cls(text)
        except ValueError:
            known = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown scope {text!r}; known scopes: {known}") from None


#: Every scope, granted when neither the host nor vessel.toml narrows them.
ALL_SCOPES: frozenset[Scope] = frozenset(Scope)


class InputMode(str, enum.Enum):
    """How a declared command receives its arguments."""

    JSON_STDIN = "json-stdin"
    ARGS = "args"

    def __str__(self) -> str:
        return self.value


class ToolKind(str, enum.Enum):
    """Where a tool runs."""

    COMMAND = "command"  # a declared command, confined in the turn's sandbox
    SERVICE = "service"  # an HTTP POST to a [services] entry, or a bound Python callable
    BUILTIN = "builtin"  # one of BUILTIN_NAMES
    PYTHON = "python"  # a host-process Python function registered with Registry.tool


def check_name(name: object) -> str | None:
    """Return why ``name`` is not a valid tool name, or None when it is."""
    if not isinstance(name, str) or not _NAME.match(name):
        return (
            f"{name!r} is not a valid tool name: use lowercase letters, digits and "
            "underscores, starting with a letter, at most 63 characters"
        )
    return None


def check_parameters(schema: object) -> str | None:
    """Return why ``schema`` is not a JSON Schema of type object, or None when it is."""
    if not isinstance(schema, Mapping):
        return "must be a table (a JSON Schema of type object)"
    if schema.get("type") != "object":
        return 'must be a JSON Schema with type = "object"'
    props = schema.get("properties", {})
    if not isinstance(props, Mapping):
        return "properties must be a table of JSON Schemas"
    try:
        jsonschema.Draft202012Validator.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"is not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
    return None


@attrs.frozen(kw_only=True)
class ToolSpec:
    """One tool: its name, description, parameters schema, and how it runs.

    Build declared tools with ``ToolSpec.command_tool``; ``Agent.load`` reads them
    from tool files with ``ToolSpec.from_toml``.
    """

    name: str
    description: str
    kind: ToolKind
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: copy.deepcopy(dict(_EMPTY_OBJECT)), eq=False
    )
    command: tuple[str, ...] | None = None
    service: str | None = None
    input: InputMode = InputMode.JSON_STDIN
    #: None means the agent's ``tool_timeout_seconds``.
    timeout_seconds: float | None = None
    scope: Scope = Scope.READ
    #: The tool file it came from, for error messages.
    source: Path | None = attrs.field(default=None, eq=False)

    @classmethod
    def command_tool(
        cls,
        name: str,
        description: str,
        command: list[str] | tuple[str, ...],
        *,
        parameters: Mapping[str, Any] | None = None,
        input: InputMode | str = InputMode.JSON_STDIN,
        timeout_seconds: float | None = None,
        scope: Scope | str = Scope.READ,
    ) -> ToolSpec:
        """Build and check a declared command tool in code (what a tool file describes)."""
        params = dict(parameters) if parameters is not None else dict(_EMPTY_OBJECT)
        for problem in (check_name(name), _named("parameters", check_parameters(params))):
            if problem:
                raise ValueError(problem)
        if not command or not all(isinstance(a, str) for a in command):
            raise ValueError("command must be a non-empty list of strings")
        return cls(
            name=name,
            description=description,
            kind=ToolKind.COMMAND,
            parameters=params,
            command=tuple(command),
            input=InputMode(input),
            timeout_seconds=timeout_seconds,
            scope=Scope.parse(str(scope)),
        )

    @property
    def property_names(self) -> tuple[str, ...]:
        """The argument names declared under ``parameters.properties``, in declaration order."""
        return tuple(self.parameters.get("properties", {}) or {})

    @classmethod
    def from_toml(
        cls, data: Mapping[str, Any], *, source: Path
    ) -> tuple[ToolSpec | None, list[str]]:
        """Check a parsed tool file; return the spec (None if broken) and every problem found."""
        try:
            raw = converter.structure(dict(data), _ToolFile)
        except Exception as exc:
            return None, describe_errors(exc)
        problems = [p for p in _tool_file_problems(raw) if p]
        if problems:
            return None, problems
        return (
            cls(
                name=raw.name,
                description=raw.description,
                kind=ToolKind.COMMAND if raw.command is not None else ToolKind.SERVICE,
                parameters=raw.parameters if raw.parameters is not None else dict(_EMPTY_OBJECT),
                command=tuple(raw.command) if raw.command is not None else None,
                service=raw.service,
                input=InputMode(raw.input),
                timeout_seconds=raw.timeout_seconds,
                scope=Scope(raw.scope),
                source=source,
            ),
            [],
        )


def _named(key: str, problem: str | None) -> str | None:
    return f"{key}: {problem}" if problem else None


@attrs.define
class _ToolFile:
    name: str
    description: str
    command: list[str] | None = None
    service: str | None = None
    parameters: Any = None
    input: str = "json-stdin"
    timeout_seconds: float | None = None
    scope: str = "tools:read"


def _tool_file_problems(raw: _ToolFile) -> list[str | None]:
    problems: list[str | None] = [_named("name", check_name(raw.name))]
    if raw.name in BUILTIN_NAMES:
        problems.append(f"name: {raw.name!r} is a built-in tool's name; choose another")
    if not raw.description.strip():
        problems.append("description: must not be empty; the model reads it to decide when to call")
    if (raw.command is None) == (raw.service is None):
        problems.append("command/service: set exactly one of command or service")
    if raw.command is not None and not raw.command:
        problems.append(
            'command: must list the program and its arguments, such as ["python3", ...]'
        )
    if raw.parameters is not None:
        problems.append(_named("parameters", check_parameters(raw.parameters)))
    if raw.input not in {m.value for m in InputMode}:
        problems.append(f'input: {raw.input!r} is not accepted; use "json-stdin" or "args"')
    if raw.input == InputMode.ARGS.value and raw.service is not None:
        problems.append('input: "args" applies to command tools only')
    if raw.timeout_seconds is not None and not raw.timeout_seconds > 0:
        problems.append("timeout_seconds: must be a positive number of seconds")
    if raw.scope not in {s.value for s in Scope}:
        known = ", ".join(s.value for s in Scope)
        problems.append(f"scope: unknown scope {raw.scope!r}; known scopes: {known}")
    return problems

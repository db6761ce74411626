"""ToolSpec: one tool the model may call, and how a declared tool file becomes one."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import jsonschema

from ._ground._convert import Structured, structure_leniently
from ._ground._kinds import ALL_SCOPES, InputMode, Scope, ToolKind
from ._ground._seconds import check_seconds
from ._ground._suggest import unknown_name
from .builtins import BUILTIN_NAMES
from .errors import UsageError

__all__ = [
    "ALL_SCOPES",
    "BUILTIN_NAMES",
    "Handler",
    "InputMode",
    "Scope",
    "ToolKind",
    "ToolSpec",
]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_EMPTY_OBJECT: Mapping[str, Any] = {"type": "object", "properties": {}}


class Handler(Protocol):
    """What a Python tool's spec carries: the function, and how to call it with arguments."""

    @property
    def func(self) -> Callable[..., Any]: ...

    def structure(self, arguments: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Arguments for ``func`` as (positional, keyword); raise ``ValueError`` if unfit."""
        ...

    @property
    def output_schema(self) -> Mapping[str, Any] | None:
        """The JSON Schema of the object ``func`` returns, or None when it is not known."""
        ...


def _canonical(schema: Mapping[str, Any] | str) -> str:
    # Compact JSON in the author's key order: the order of ``properties`` is meaningful
    # (it is the argv order of an args-mode tool, and the order the model reads).
    # A string is JSON text, such as the canonical default below.
    value = json.loads(schema) if isinstance(schema, str) else schema
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


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
    from tool files with ``ToolSpec.from_toml``; ``Registry.tool`` builds Python
    tools, whose function the spec carries as ``handler``. The schema is kept as
    compact JSON text, so a spec is immutable and two specs with different schemas
    are never equal; ``parameters`` hands out a fresh copy each time.
    """

    name: str
    description: str
    kind: ToolKind
    _schema: str = attrs.field(
        alias="parameters", converter=_canonical, default=_canonical(_EMPTY_OBJECT), repr=False
    )
    command: tuple[str, ...] | None = None
    service: str | None = None
    input: InputMode = InputMode.JSON_STDIN
    #: None means the agent's ``tool_timeout_seconds``.
    timeout_seconds: float | None = None
    scope: Scope = Scope.READ
    #: The tool file it came from, for error messages.
    source: Path | None = attrs.field(default=None, eq=False)
    #: A Python tool's function (``Registry.tool`` sets it); None for every other kind.
    handler: Handler | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def schema_json(self) -> str:
        """The parameters schema as the compact JSON text the spec keeps (and compares)."""
        return self._schema

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of the tool's arguments (a fresh dict the caller may change)."""
        schema: dict[str, Any] = json.loads(self._schema)
        return schema

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
        """Build and check a declared command tool in code (what a tool file describes).

        Raises ``UsageError`` for each value a tool file could not hold either: a
        bad name, an empty description, ``command`` as one string (not a list of
        them), ``parameters`` that are not a JSON Schema object, a
        ``timeout_seconds`` that ``check_seconds`` refuses, an unknown input or scope.
        """
        if parameters is not None and not isinstance(parameters, Mapping):
            raise UsageError(f"parameters is a JSON Schema object (a dict), not {parameters!r}")
        params = dict(parameters) if parameters is not None else dict(_EMPTY_OBJECT)
        for problem in (check_name(name), _named("parameters", check_parameters(params))):
            if problem:
                raise UsageError(problem)
        if not isinstance(description, str) or not description.strip():
            raise UsageError(
                f"description is the text the model reads to decide when to call "
                f"{name}, not {description!r}"
            )
        given: object = command  # typed as a list, but a host may pass one string
        if isinstance(given, str) or not command or not all(isinstance(a, str) for a in command):
            raise UsageError(
                f"command must be a non-empty list of strings such as ['ls', '-l'], not {command!r}"
            )
        if timeout_seconds is not None:
            timeout_seconds = check_seconds("timeout_seconds", timeout_seconds)
        if str(input) not in {m.value for m in InputMode}:
            raise UsageError(f'input: {str(input)!r} is not accepted; use "json-stdin" or "args"')
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
        return tuple(json.loads(self._schema).get("properties", {}) or {})

    @classmethod
    def from_toml(
        cls, data: Mapping[str, Any], *, source: Path
    ) -> tuple[ToolSpec | None, list[str]]:
        """Check a parsed tool file; return the spec (None if broken) and every problem found."""
        # Type and value problems together: a refused value is left out and the rules of the
        # others still run, so a file with four mistakes reports four at once.
        structured = structure_leniently(dict(data), _ToolFile)
        raw = structured.value
        problems = [*structured.problems, *(p for p in _tool_file_problems(structured) if p)]
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


def _tool_file_problems(structured: Structured[_ToolFile]) -> list[str | None]:
    """Every value rule of a tool file, on the keys whose type was right (``structured.fine``)."""
    raw, fine = structured.value, structured.fine
    problems: list[str | None] = []
    if fine("name"):
        problems.append(_named("name", check_name(raw.name)))
        if raw.name in BUILTIN_NAMES:
            problems.append(f"name: {raw.name!r} is a built-in tool's name; choose another")
    if fine("description") and not raw.description.strip():
        problems.append("description: must not be empty; the model reads it to decide when to call")
    if fine("command") and fine("service") and (raw.command is None) == (raw.service is None):
        problems.append("command/service: set exactly one of command or service")
    if fine("command") and raw.command is not None and not raw.command:
        problems.append(
            'command: must list the program and its arguments, such as ["python3", ...]'
        )
    if fine("parameters") and raw.parameters is not None:
        problems.append(_named("parameters", check_parameters(raw.parameters)))
    if fine("input") and raw.input not in {m.value for m in InputMode}:
        problems.append(f'input: {raw.input!r} is not accepted; use "json-stdin" or "args"')
    if raw.input == InputMode.ARGS.value and raw.service is not None:
        problems.append('input: "args" applies to command tools only')
    if raw.timeout_seconds is not None and not raw.timeout_seconds > 0:
        problems.append("timeout_seconds: must be a positive number of seconds")
    if fine("scope") and raw.scope not in {s.value for s in Scope}:
        problems.append(f"scope: {unknown_name('scope', raw.scope, [s.value for s in Scope])}")
    return problems

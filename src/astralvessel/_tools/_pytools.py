"""Python tools: a typed function becomes a tool, its schema derived from its signature.

``Registry.tool`` calls `python_tool` to turn a function into a `ToolSpec` (kind
``PYTHON``) and a `PythonTool` that knows how to call it. The schema comes from
the type hints (``str``, ``int``, ``float``, ``bool``, lists, tuples, sets,
``dict[str, X]``, ``Literal``, enums, ``X | None``, attrs classes and
dataclasses, ``Annotated[X, "description"]``) and the descriptions from the
docstring (Google, NumPy or Sphinx style). Arguments the model sends are checked
against that schema by the executor, then structured into the hinted types with
cattrs.

Python tools run in the host process, with all of its rights: no sandbox
stands between them and the machine.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union

import attrs
import cattrs

from .._ground._convert import describe_errors
from ..errors import ToolError, ToolRegistrationError
from ..results import ToolResult
from ..spec import BUILTIN_NAMES, Scope, ToolKind, ToolSpec, check_name, check_parameters

__all__ = ["PythonTool", "ToolError", "python_tool", "schema_for"]

# ToolError lives in errors.py with the rest of the tree; it is re-exported here,
# where Python tools have always imported it from.


# One converter for every Python tool: arguments were already checked against the
# derived schema, so it only has to build the hinted types (enums, attrs classes...).
_argument_converter = cattrs.Converter(forbid_extra_keys=True)

_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
}


@attrs.frozen(kw_only=True)
class PythonTool:
    """A registered Python function and what is needed to call it with a model's arguments."""

    func: Callable[..., Any]
    #: Each parameter's type hint, by name, in signature order.
    hints: Mapping[str, Any]
    #: Parameters that can only be passed by position.
    positional: tuple[str, ...] = ()
    is_async: bool = False
    #: The JSON object the function returns, from its return annotation; None when the
    #: annotation is missing or is not an object (MCP's ``outputSchema`` must be one).
    output_schema: Mapping[str, Any] | None = None

    def structure(self, arguments: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Build positional and keyword arguments; raise ``ValueError`` saying what is wrong."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        for name, value in arguments.items():
            try:
                values[name] = _argument_converter.structure(value, self.hints[name])
            except Exception as exc:  # cattrs raises errors of many kinds
                problems.extend(f"{name}{_join(line)}" for line in describe_errors(exc))
        if problems:
            raise ValueError("; ".join(problems))
        args = [values.pop(name) for name in self.positional if name in values]
        return args, values


def _join(line: str) -> str:
    return line if line.startswith(("[", ".")) else f": {line}"


def python_tool(
    func: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    scope: Scope | str = Scope.READ,
    timeout_seconds: float | None = None,
) -> ToolSpec:
    """Derive a tool from ``func``, carrying it as ``handler``; raise ``ToolRegistrationError``."""
    tool_name = name if name is not None else getattr(func, "__name__", "")
    problem = check_name(tool_name)
    if problem:
        raise ToolRegistrationError(f"{problem} (pass name= to Registry.tool)")
    if tool_name in BUILTIN_NAMES:
        raise ToolRegistrationError(f"{tool_name!r} is a built-in tool's name; choose another")
    summary, param_docs = parse_docstring(inspect.getdoc(func) or "")
    text = (description if description is not None else summary).strip()
    if not text:
        raise ToolRegistrationError(
            f"Python tool {tool_name!r} has no description: give the function a docstring "
            "or pass description= (the model reads it to decide when to call the tool)"
        )
    if timeout_seconds is not None and not timeout_seconds > 0:
        raise ToolRegistrationError("timeout_seconds must be a positive number of seconds")
    parameters, hints, positional = _signature_schema(tool_name, func, param_docs)
    problem = check_parameters(parameters)
    if problem:  # pragma: no cover - a derived schema that fails is a bug here
        raise ToolRegistrationError(f"the schema derived for {tool_name!r} {problem}")
    handler = PythonTool(
        func=func,
        hints=hints,
        positional=positional,
        is_async=inspect.iscoroutinefunction(func),
        output_schema=_output_schema(func),
    )
    return ToolSpec(
        name=tool_name,
        description=text,
        kind=ToolKind.PYTHON,
        parameters=parameters,
        timeout_seconds=timeout_seconds,
        scope=Scope.parse(str(scope)),
        handler=handler,
    )


def _signature_schema(
    tool_name: str, func: Callable[..., Any], param_docs: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]:
    try:
        signature = inspect.signature(func)
        resolved = typing.get_type_hints(func, include_extras=True)
    except (NameError, TypeError, ValueError) as exc:
        raise ToolRegistrationError(
            f"cannot read the signature of Python tool {tool_name!r}: {exc}"
        ) from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    hints: dict[str, Any] = {}
    positional: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolRegistrationError(
                f"Python tool {tool_name!r} takes "
                f"{'*' if param.kind is param.VAR_POSITIONAL else '**'}{param.name}; "
                "the model can only fill named parameters, so list each one"
            )
        if param.name not in resolved:
            raise ToolRegistrationError(
                f"parameter {param.name!r} of Python tool {tool_name!r} has no type hint; "
                "annotate it so its schema can be derived"
            )
        hint = resolved[param.name]
        try:
            schema = schema_for(hint)
        except TypeError as exc:
            raise ToolRegistrationError(
                f"parameter {param.name!r} of Python tool {tool_name!r}: {exc}"
            ) from None
        # The parameter's own note wins over its type's docstring; an Annotated note wins over both.
        if param_docs.get(param.name) and typing.get_origin(hint) is not typing.Annotated:
            schema = {**schema, "description": param_docs[param.name]}
            schema = {"description": schema.pop("description"), **schema}
        if param.default is param.empty:
            required.append(param.name)
        elif _json_value(param.default):
            schema["default"] = _argument_converter.unstructure(param.default)
        properties[param.name] = schema
        hints[param.name] = hint
        if param.kind is param.POSITIONAL_ONLY:
            positional.append(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    # The function accepts nothing else, so the model may not send anything else.
    parameters["additionalProperties"] = False
    return parameters, hints, tuple(positional)


def _output_schema(func: Callable[..., Any]) -> dict[str, Any] | None:
    """The schema of the object ``func`` returns, when its annotation says it returns one.

    Best effort: a return type that cannot be described only means no output schema,
    never a refused tool (the model reads the result's text either way).
    """
    try:
        hint = typing.get_type_hints(func, include_extras=True).get("return")
        if hint is None or (isinstance(hint, type) and issubclass(hint, ToolResult)):
            return None  # a ToolResult is the model's text as it is, not JSON
        schema = schema_for(hint)
    except (NameError, TypeError, ValueError):
        return None
    return schema if schema.get("type") == "object" else None


def _json_value(value: object) -> bool:
    if value is None or isinstance(value, (str, int, float, bool, enum.Enum)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_json_value(v) for v in value)
    return False


def schema_for(hint: Any, _seen: frozenset[type] = frozenset()) -> dict[str, Any]:  # noqa: PLR0911
    """The JSON Schema for one type hint; raise ``TypeError`` naming a hint it cannot express."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return {}
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    if origin is typing.Annotated:
        schema = schema_for(args[0], _seen)
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {"description": " ".join(notes), **schema} if notes else schema
    if origin is Literal:
        return _enum_schema(list(args))
    if origin is Union or origin is getattr(types, "UnionType", None):
        return _union_schema(args, _seen)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _python_enum_schema(hint)
    if isinstance(hint, type) and (attrs.has(hint) or dataclasses.is_dataclass(hint)):
        return _class_schema(hint, _seen)
    container = _container_schema(origin or hint, args, _seen)
    if container is None:
        raise TypeError(
            f"cannot describe {_name(hint)} to a model; use str, int, float, bool, lists, "
            "dict[str, ...], Literal, an Enum, an attrs class or a dataclass"
        )
    return container


def _container_schema(
    origin: Any, args: tuple[Any, ...], seen: frozenset[type]
) -> dict[str, Any] | None:
    items = schema_for(args[0], seen) if args else {}
    if origin in (list, collections.abc.Sequence, collections.abc.Iterable):
        return {"type": "array", "items": items}
    if origin in (set, frozenset, collections.abc.Set):
        return {"type": "array", "items": items, "uniqueItems": True}
    if origin is tuple:
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            return {"type": "array", "items": items}
        return {
            "type": "array",
            "prefixItems": [schema_for(a, seen) for a in args],
            "items": False,
            "minItems": len(args),
        }
    if origin in (dict, collections.abc.Mapping):
        if args and args[0] is not str:
            raise TypeError("JSON object keys are strings; use dict[str, ...]")
        return {"type": "object", "additionalProperties": schema_for(args[1], seen) if args else {}}
    return None


def _python_enum_schema(cls: type[enum.Enum]) -> dict[str, Any]:
    schema = _enum_schema([member.value for member in cls])
    doc = cls.__doc__
    # Enum classes without a docstring inherit a generic one; only the author's own helps.
    if doc and doc != enum.Enum.__doc__ and "An enumeration." not in doc:
        return {"description": inspect.cleandoc(doc).split("\n\n")[0], **schema}
    return schema


def _name(hint: Any) -> str:
    return getattr(hint, "__qualname__", None) or repr(hint)


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"enum": [v.value if isinstance(v, enum.Enum) else v for v in values]}
    kinds = {type(v) for v in schema["enum"]}
    if len(kinds) == 1:
        kind = kinds.pop()
        if kind in _SCALARS:
            schema = {**_SCALARS[kind], **schema}
    return schema


def _union_schema(args: tuple[Any, ...], seen: frozenset[type]) -> dict[str, Any]:
    options = [schema_for(a, seen) for a in args if a is not type(None)]
    nullable = type(None) in args
    if len(options) == 1 and not nullable:
        return options[0]
    if nullable:
        options.append({"type": "null"})
    return {"anyOf": options}


def _class_schema(cls: type, seen: frozenset[type]) -> dict[str, Any]:
    if cls in seen:
        raise TypeError(f"{cls.__qualname__} refers to itself; recursive types cannot be described")
    seen = seen | {cls}
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except NameError as exc:
        raise TypeError(f"cannot resolve the field types of {cls.__qualname__}: {exc}") from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field_name, has_default, metadata in _class_fields(cls):
        schema = schema_for(hints[field_name], seen)
        text = metadata.get("description")
        if isinstance(text, str) and "description" not in schema:
            schema = {"description": text, **schema}
        properties[field_name] = schema
        if not has_default:
            required.append(field_name)
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    result["additionalProperties"] = False
    doc = inspect.getdoc(cls)
    if doc and not re.match(rf"^{re.escape(cls.__name__)}\(", doc):  # not the generated one
        result = {"description": doc.split("\n\n")[0], **result}
    return result


def _class_fields(cls: type) -> list[tuple[str, bool, Mapping[str, Any]]]:
    if attrs.has(cls):
        return [
            (f.alias or f.name, f.default is not attrs.NOTHING, f.metadata)
            for f in attrs.fields(cls)
            if f.init
        ]
    return [
        (
            f.name,
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
            f.metadata,
        )
        for f in dataclasses.fields(cls)
        if f.init
    ]


# -- docstrings ---------------------------------------------------------------------------

_GOOGLE_HEADERS = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|Return|"
    r"Yields|Raises|Examples?|Notes?|See Also|Attributes)\s*:\s*$"
)
_NUMPY_UNDERLINE = re.compile(r"^-{3,}\s*$")
_SPHINX_FIELD = re.compile(
    r"^:(param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$"
)
_GOOGLE_PARAM = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_PARAM = re.compile(r"^(\w+)\s*(?::.*)?$")
_PARAM_SECTIONS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"}


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and a description per parameter.

    The description is everything before the first section (``Args:``,
    ``Parameters`` underlined, ``:param x:``...). Parameters come from Google
    (``name: text``), NumPy (``name : type`` then indented text) and Sphinx
    (``:param name: text``) sections; continuation lines are joined.
    """
    lines = doc.expandtabs().splitlines()
    index = 0
    while index < len(lines) and not _starts_section(lines, index):
        index += 1
    return "\n".join(lines[:index]).strip(), _parameter_notes(lines[index:])


def _starts_section(lines: list[str], index: int) -> bool:
    line = lines[index].strip()
    nxt = lines[index + 1].strip() if index + 1 < len(lines) else ""
    return bool(
        _GOOGLE_HEADERS.match(line)
        or _SPHINX_FIELD.match(line)
        or line.startswith(":return")
        or (line and _NUMPY_UNDERLINE.match(nxt))
    )


def _parameter_notes(lines: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    # Google items sit indented under their header; NumPy items align with it.
    base_indent: int | None = None
    skip_underline = False
    for index, raw in enumerate(lines):
        line = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if skip_underline:
            skip_underline = False
            continue
        if _starts_section(lines, index) and not _SPHINX_FIELD.match(line):
            header = _GOOGLE_HEADERS.match(line)
            section = (header.group(1) if header else line).lower()
            current, base_indent, skip_underline = None, None if header else indent, not header
            continue
        sphinx = _SPHINX_FIELD.match(line)
        if sphinx:
            section, current = "sphinx", sphinx.group(2)
            params[current] = sphinx.group(3).strip()
        elif line.startswith(":"):
            section, current = None, None
        elif line and (section == "sphinx" or section in _PARAM_SECTIONS):
            if section != "sphinx" and base_indent is None:
                base_indent = indent
            if section != "sphinx" and base_indent is not None and indent <= base_indent:
                current = _parameter_name(line, params)
            elif current is not None:
                params[current] = f"{params[current]} {line}".strip()
    return params


def _parameter_name(line: str, params: dict[str, str]) -> str | None:
    google = None if " : " in line else _GOOGLE_PARAM.match(line)
    if google:
        name = google.group(1).lstrip("*")
        params[name] = google.group(2).strip()
        return name
    numpy = _NUMPY_PARAM.match(line.split(" : ", maxsplit=1)[0] if " : " in line else line)
    if numpy:
        params[numpy.group(1)] = ""
        return numpy.group(1)
    return None

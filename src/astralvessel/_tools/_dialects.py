"""Schema dialects: one tool rendered in each model API's shape, chosen by table.

``render_schema(spec, dialect)`` is pure. OpenAI's strict mode (structured
outputs for tool calls) accepts only a subset of JSON Schema; ``strict_compatible``
says whether a tool's parameters already lie inside it, so that asking for strict
schemas never changes what a tool accepts: a tool outside the subset is sent
with ``strict: false`` rather than rewritten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from ..spec import ToolKind, ToolSpec

__all__ = ["DIALECTS", "Dialect", "mcp_annotations", "render_schema", "strict_compatible"]

#: The model APIs ``Registry.schemas`` renders for.
Dialect = Literal["openai", "openai-responses", "anthropic", "mcp"]

# The keywords OpenAI's strict mode accepts, per the function-calling guide. Anything
# else (allOf, not, if/then/else, patternProperties, default, minLength...) is refused
# by the API when strict is true, so a schema using it is not strict-compatible.
_STRICT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "description",
        "title",
        "$defs",
        "$ref",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    }
)


def strict_compatible(schema: object, *, root: bool = True) -> bool:
    """Whether ``schema`` lies inside OpenAI's strict subset exactly as it is.

    The root is an object; every object lists all its properties as required and
    sets ``additionalProperties: false``; only the keywords strict mode knows appear.
    """
    if not isinstance(schema, Mapping) or not set(schema) <= _STRICT_KEYWORDS:
        return False
    if root and (schema.get("type") != "object" or "anyOf" in schema):
        return False
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        if not isinstance(properties, Mapping) or schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required", ())) != set(properties):
            return False
        if not all(strict_compatible(s, root=False) for s in properties.values()):
            return False
    subschemas: list[object] = []
    if "items" in schema:
        subschemas.append(schema["items"])
    for key in ("anyOf",):
        subschemas.extend(schema.get(key) or ())
    defs = schema.get("$defs") or {}
    subschemas.extend(defs.values() if isinstance(defs, Mapping) else [None])
    return all(strict_compatible(s, root=False) for s in subschemas)


# -- MCP extras: titles and behaviour hints for the built-ins -------------------------------

#: Human titles of the built-ins, shown by MCP clients in place of the bare name.
_TITLES: Mapping[str, str] = MappingProxyType(
    {
        "read": "Read a file",
        "grep": "Search file contents",
        "glob": "Find files by pattern",
        "list": "List a folder",
        "bash": "Run a shell command",
        "webfetch": "Fetch a web page",
        "websearch": "Search the web",
    }
)
_READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True}
_OPEN_WORLD = {"readOnlyHint": True, "openWorldHint": True}
#: MCP tool annotations of the built-ins: the file tools only look; the web tools reach out.
_ANNOTATIONS: Mapping[str, Mapping[str, bool]] = MappingProxyType(
    {
        "read": {**_READ_ONLY, "openWorldHint": False},
        "grep": {**_READ_ONLY, "openWorldHint": False},
        "glob": {**_READ_ONLY, "openWorldHint": False},
        "list": {**_READ_ONLY, "openWorldHint": False},
        # bash writes only the turn's workspace, which ends with the turn.
        "bash": {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False},
        "webfetch": _OPEN_WORLD,
        "websearch": _OPEN_WORLD,
    }
)


def mcp_annotations(spec: ToolSpec) -> dict[str, Any] | None:
    """The MCP ``annotations`` of a tool (title and hints), or None when we know none."""
    if spec.kind is not ToolKind.BUILTIN or spec.name not in _ANNOTATIONS:
        return None
    return {"title": _TITLES[spec.name], **_ANNOTATIONS[spec.name]}


# -- one renderer per dialect ---------------------------------------------------------------


def _openai_chat(spec: ToolSpec, parameters: dict[str, Any], strict: bool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": parameters,
            "strict": strict,
        },
    }


def _openai_responses(spec: ToolSpec, parameters: dict[str, Any], strict: bool) -> dict[str, Any]:
    # The SDK's FunctionToolParam requires "strict", so it is always present.
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": parameters,
        "strict": strict,
    }


def _anthropic(spec: ToolSpec, parameters: dict[str, Any], strict: bool) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": parameters}


def _mcp(spec: ToolSpec, parameters: dict[str, Any], strict: bool) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "name": spec.name,
        "description": spec.description,
        "inputSchema": parameters,
    }
    annotations = mcp_annotations(spec)
    if annotations is not None:
        tool["title"] = annotations["title"]
        tool["annotations"] = annotations
    # Only a Python tool's return annotation says what shape its JSON output has.
    output = spec.handler.output_schema if spec.handler is not None else None
    if output is not None:
        tool["outputSchema"] = dict(output)
    return tool


_Renderer = Callable[[ToolSpec, dict[str, Any], bool], dict[str, Any]]

#: The renderer of each dialect.
_RENDERERS: Mapping[str, _Renderer] = MappingProxyType(
    {
        "openai": _openai_chat,
        "openai-responses": _openai_responses,
        "anthropic": _anthropic,
        "mcp": _mcp,
    }
)
DIALECTS: tuple[str, ...] = tuple(_RENDERERS)


def render_schema(spec: ToolSpec, dialect: Dialect, *, strict: bool = False) -> dict[str, Any]:
    """One tool in one model API's shape.

    With ``strict``, OpenAI tools whose parameters are strict-compatible carry
    ``strict: true``; every other OpenAI tool carries ``strict: false``.
    """
    parameters = spec.parameters
    parameters.setdefault("properties", {})
    return _RENDERERS[dialect](spec, parameters, strict and strict_compatible(parameters))

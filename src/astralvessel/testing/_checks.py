"""Checks of an agent folder as a test suite runs them: the folder loads, every schema is valid.

Pure functions over an agent folder and a registry; the pytest plugin turns
each into a test item. ``schema_problems`` checks every tool's schema for one
dialect twice: as a JSON Schema (Draft 2020-12, closed to a top-level object),
and, where that API's SDK is installed, as the SDK's own tool type accepts it
(the types the library targets, see ``SDK_TYPES``). A dialect whose SDK is not
installed is a problem too: a check that cannot run must not pass.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import jsonschema

from ..agent import Agent
from ..registry import Dialect, Registry

__all__ = ["DIALECTS", "SDK_TYPES", "check_folder", "schema_problems", "snapshot_text"]

#: The SDK type each dialect's tools must validate as: (module, attribute, what to install).
SDK_TYPES: Mapping[str, tuple[str, str, str]] = {
    "openai": ("openai.types.chat", "ChatCompletionToolParam", "openai"),
    "openai-responses": ("openai.types.responses", "FunctionToolParam", "openai"),
    "anthropic": ("anthropic.types", "ToolParam", "anthropic"),
    "mcp": ("mcp.types", "Tool", "mcp"),
}

#: Every dialect ``Registry.schemas`` renders.
DIALECTS: tuple[str, ...] = get_args(Dialect)
# The tool names every targeted API accepts.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_folder(path: Path) -> Registry:
    """Load the agent folder (raising ``ConfigError`` with every problem) and its registry."""
    return Registry.for_agent(Agent.load(path))


def _materialized(value: object) -> object:
    # The SDKs' TypedDicts use Iterable[...], which pydantic validates lazily.
    if isinstance(value, Iterator):
        return [_materialized(item) for item in value]
    if isinstance(value, dict):
        return {key: _materialized(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_materialized(item) for item in value]
    return value


def _sdk_validator(dialect: str) -> tuple[Any, str | None]:
    module, attribute, package = SDK_TYPES[dialect]
    try:
        kind = getattr(importlib.import_module(module), attribute)
        from pydantic import TypeAdapter
    except ImportError:
        return None, (
            f"{dialect}: cannot check against the SDK's types: install {package} "
            f"(or leave {dialect} out of vessel_dialects)"
        )
    return TypeAdapter(kind), None


def _parameters(schema: Mapping[str, Any], dialect: str) -> Mapping[str, Any]:
    if dialect == "openai":
        return dict(schema.get("function", {})).get("parameters", {})  # type: ignore[no-any-return]
    key = {"anthropic": "input_schema", "mcp": "inputSchema"}.get(dialect, "parameters")
    return schema.get(key, {})  # type: ignore[no-any-return]


def _name(schema: Mapping[str, Any], dialect: str) -> str:
    body = schema.get("function", {}) if dialect == "openai" else schema
    return str(body.get("name", ""))


def schema_problems(registry: Registry, dialect: str) -> list[str]:
    """Every problem of the registry's schemas in ``dialect``; empty when all are sound."""
    if dialect not in DIALECTS:
        return [f"{dialect!r} is not a dialect; use one of {', '.join(DIALECTS)}"]
    adapter, missing = _sdk_validator(dialect)
    problems = [missing] if missing else []
    for schema in registry.schemas(dialect):  # type: ignore[arg-type]
        name = _name(schema, dialect)
        if not _NAME.match(name):
            problems.append(f"{name!r}: a tool name is 1 to 64 letters, digits, _ or -")
        parameters = _parameters(schema, dialect)
        try:
            jsonschema.Draft202012Validator.check_schema(dict(parameters))
        except jsonschema.SchemaError as exc:
            problems.append(f"{name}: its parameters are not a valid JSON Schema: {exc.message}")
        if parameters.get("type") != "object":
            problems.append(f"{name}: its parameters must describe an object")
        if adapter is not None:
            try:
                _materialized(adapter.validate_python(schema))
            except ValueError as exc:
                first = str(exc).splitlines()[:4]
                problems.append(f"{name}: the {dialect} SDK refuses it: {' '.join(first)}")
    return problems


def snapshot_text(schemas: Sequence[Mapping[str, Any]]) -> str:
    """The schemas as stable, reviewable JSON text (sorted keys, two-space indent)."""
    return json.dumps(list(schemas), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

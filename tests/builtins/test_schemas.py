"""The built-ins' metadata: names, schemas per the spec, scopes, kinds, and every dialect."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from astralvessel.builtins import BUILTINS, Builtin
from astralvessel.registry import Registry, builtin_spec
from astralvessel.spec import BUILTIN_NAMES


def _props(name: str) -> dict[str, Any]:
    return dict(BUILTINS[name].parameters["properties"])


def test_the_seven_builtins_in_spec_order() -> None:
    """BUILTINS holds exactly the seven built-ins, named as the spec names them."""
    assert tuple(BUILTINS) == BUILTIN_NAMES
    assert all(isinstance(b, Builtin) and b.name == n for n, b in BUILTINS.items())


@pytest.mark.parametrize(
    ("name", "scope", "kind"),
    [
        ("read", "tools:files", "server"),
        ("grep", "tools:search", "confined"),
        ("glob", "tools:files", "server"),
        ("list", "tools:files", "server"),
        ("bash", "tools:execute", "confined"),
        ("webfetch", "tools:search", "web"),
        ("websearch", "tools:search", "web"),
    ],
)
def test_scope_and_kind_follow_the_spec_table(name: str, scope: str, kind: str) -> None:
    """Each tool's scope and where it runs are the spec table's."""
    assert (BUILTINS[name].scope, BUILTINS[name].kind) == (scope, kind)


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_each_schema_is_valid_and_closed(name: str) -> None:
    """Every parameters schema is a valid JSON Schema object refusing unknown arguments."""
    schema = dict(BUILTINS[name].parameters)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert all(p.get("description") for p in schema["properties"].values())
    assert len(BUILTINS[name].description) > 40


@pytest.mark.parametrize(
    ("name", "required", "arguments"),
    [
        ("read", ["path"], {"path", "offset", "limit"}),
        ("grep", ["pattern"], {"pattern", "path", "glob", "ignore_case", "max_results"}),
        ("glob", ["pattern"], {"pattern", "path", "max_results"}),
        ("list", [], {"path"}),
        ("bash", ["command"], {"command"}),
        ("webfetch", ["url"], {"url", "full_page", "link_targets"}),
        ("websearch", ["query"], {"query", "max_results"}),
    ],
)
def test_argument_names_and_required_ones(
    name: str, required: list[str], arguments: set[str]
) -> None:
    """Argument names and which are required are exactly the spec's."""
    assert set(_props(name)) == arguments
    assert BUILTINS[name].parameters.get("required", []) == required


@pytest.mark.parametrize(
    ("name", "argument", "default", "maximum"),
    [
        ("read", "offset", 1, None),
        ("read", "limit", 400, 2000),
        ("grep", "max_results", 100, 1000),
        ("grep", "ignore_case", False, None),
        ("glob", "max_results", 200, 2000),
        ("websearch", "max_results", 8, 20),
    ],
)
def test_defaults_and_maxima(
    name: str, argument: str, default: object, maximum: int | None
) -> None:
    """Each default and maximum is the spec's number."""
    prop = _props(name)[argument]
    assert prop["default"] == default
    assert prop.get("maximum") == maximum


def test_maxima_are_enforced_by_the_schema() -> None:
    """A value above a maximum fails validation before anything runs."""
    validator = jsonschema.Draft202012Validator(dict(BUILTINS["read"].parameters))
    assert not validator.is_valid({"path": "a", "limit": 2001})
    assert validator.is_valid({"path": "a", "limit": 2000})


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "mcp"])
def test_every_builtin_renders_in_every_dialect(dialect: str) -> None:
    """The registry renders each built-in for each model API with its schema intact."""
    registry = Registry([builtin_spec(name) for name in BUILTIN_NAMES])
    rendered = registry.schemas(dialect)  # type: ignore[arg-type]
    assert len(rendered) == len(BUILTIN_NAMES)
    for tool, name in zip(rendered, BUILTIN_NAMES, strict=True):
        body = tool.get("function", tool)
        assert body["name"] == name
        schema = body.get("parameters") or body.get("input_schema") or body.get("inputSchema")
        assert schema == dict(BUILTINS[name].parameters)

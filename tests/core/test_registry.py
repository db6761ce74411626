"""Registry: membership, host additions, and schemas in each model API's documented shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from astralvessel import Agent, Registry, Scope, ToolKind, ToolRegistrationError, ToolSpec
from astralvessel._tools._dialects import strict_compatible

EXAMPLE = Path(__file__).parents[2] / "examples" / "field-guide"

# The tool shapes each API documents, written as JSON Schemas so a test can check ours.
# OpenAI Chat Completions: tools[] = {"type": "function", "function": {name, description, parameters}},
# name: a-z, A-Z, 0-9, underscores and dashes, at most 64 characters.
OPENAI_CHAT_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object", "properties": {"type": {"const": "object"}}},
                "strict": {"type": ["boolean", "null"]},
            },
        },
    },
}
# OpenAI Responses API: function tools are flat: {"type": "function", name, description, parameters}.
OPENAI_RESPONSES_TOOL = {
    "type": "object",
    "required": ["type", "name", "parameters"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": {"type": "string"},
        "parameters": {"type": "object", "properties": {"type": {"const": "object"}}},
        "strict": {"type": ["boolean", "null"]},
    },
}
# Anthropic Messages API: {name, description, input_schema}; name ^[a-zA-Z0-9_-]{1,64}$,
# input_schema a JSON Schema object with type "object".
ANTHROPIC_TOOL = {
    "type": "object",
    "required": ["name", "input_schema"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": {"type": "string"},
        "input_schema": {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"const": "object"}},
        },
    },
}
# MCP Tool (schema 2025-06-18): {name, title?, description?, inputSchema: {type: "object",
# properties?, required?}, outputSchema?, annotations?}.
MCP_TOOL = {
    "type": "object",
    "required": ["name", "inputSchema"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "title": {"type": "string"},
        "description": {"type": "string"},
        "annotations": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "title": {"type": "string"},
                "readOnlyHint": {"type": "boolean"},
                "destructiveHint": {"type": "boolean"},
                "idempotentHint": {"type": "boolean"},
                "openWorldHint": {"type": "boolean"},
            },
        },
        "inputSchema": {
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"const": "object"},
                "properties": {"type": "object"},
                "required": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}
SHAPES: dict[str, dict[str, Any]] = {
    "openai": OPENAI_CHAT_TOOL,
    "openai-responses": OPENAI_RESPONSES_TOOL,
    "anthropic": ANTHROPIC_TOOL,
    "mcp": MCP_TOOL,
}


@pytest.fixture
def registry() -> Registry:
    return Registry.for_agent(Agent.load(EXAMPLE))


def test_for_agent_lists_builtins_then_declared(registry: Registry) -> None:
    """A registry holds the listed built-ins first, then the declared tools, in order."""
    assert [t.name for t in registry] == ["read", "grep", "glob", "list", "species", "word_count"]
    assert len(registry) == 6
    assert "species" in registry
    assert "bash" not in registry
    assert registry["read"].kind is ToolKind.BUILTIN


def test_host_can_add_and_remove(registry: Registry) -> None:
    """The host can add a tool and remove one."""
    spec = ToolSpec.command_tool("shout", "Shout.", ["echo"], scope="tools:execute")
    registry.add(spec)
    assert registry.get("shout") == spec
    assert registry.remove("species").name == "species"
    assert "species" not in registry


def test_add_refuses_duplicates_and_builtin_names(registry: Registry) -> None:
    """A name already taken, or a built-in's name, cannot be added."""
    with pytest.raises(ToolRegistrationError, match="already registered"):
        registry.add(ToolSpec.command_tool("species", "Again.", ["echo"]))
    with pytest.raises(ToolRegistrationError, match="built-in tool's name"):
        registry.add(ToolSpec.command_tool("bash", "Mine.", ["echo"]))


def test_command_tool_checks_its_fields() -> None:
    """ToolSpec.command_tool refuses a bad name, schema or command."""
    with pytest.raises(ValueError, match="not a valid tool name"):
        ToolSpec.command_tool("Bad", "d", ["x"])
    with pytest.raises(ValueError, match="parameters"):
        ToolSpec.command_tool("ok", "d", ["x"], parameters={"type": "array"})
    with pytest.raises(ValueError, match="command"):
        ToolSpec.command_tool("ok", "d", [])


@pytest.mark.parametrize("dialect", list(SHAPES))
def test_schemas_match_documented_shape(registry: Registry, dialect: str) -> None:
    """Every tool renders in exactly the shape the model API documents."""
    schemas = registry.schemas(dialect)  # type: ignore[arg-type]
    assert len(schemas) == 6
    for schema in schemas:
        jsonschema.validate(schema, SHAPES[dialect])


def test_schemas_carry_the_parameters(registry: Registry) -> None:
    """The parameters schema reaches the model unchanged."""
    (species,) = [s for s in registry.schemas("anthropic") if s["name"] == "species"]
    assert species["input_schema"]["properties"]["habitat"]["type"] == "string"
    assert species["description"].startswith("List the species")


def test_schemas_are_fresh_copies(registry: Registry) -> None:
    """Changing a returned schema does not change the registry."""
    first = registry.schemas("openai")
    first[0]["function"]["parameters"]["properties"]["x"] = {}
    assert "x" not in registry.schemas("openai")[0]["function"]["parameters"]["properties"]


def test_schemas_filter_by_scope(registry: Registry) -> None:
    """Tools outside the granted scopes are left out."""
    names = [s["name"] for s in registry.schemas("mcp", scopes=[Scope.READ])]
    assert names == ["species", "word_count"]
    names = [s["name"] for s in registry.schemas("mcp", scopes=["tools:files"])]
    assert names == ["read", "glob", "list"]


def test_unknown_dialect_and_scope(registry: Registry) -> None:
    """An unknown dialect or scope is the host's mistake and raises."""
    with pytest.raises(ValueError, match="unknown dialect"):
        registry.schemas("gemini")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown scope"):
        registry.schemas("openai", scopes=["tools:everything"])


def test_mcp_shape_accepted_by_the_sdk(registry: Registry) -> None:
    """The MCP SDK's own Tool model accepts our MCP schemas."""
    from mcp import types

    for schema in registry.schemas("mcp"):
        types.Tool.model_validate(schema)


def test_openai_schemas_carry_strict(registry: Registry) -> None:
    """Both OpenAI dialects always say ``strict``; false unless the host asks for strict."""
    assert {s["strict"] for s in registry.schemas("openai-responses")} == {False}
    assert {s["function"]["strict"] for s in registry.schemas("openai")} == {False}


def test_strict_applies_only_where_the_schema_allows_it() -> None:
    """Asked for strict, a tool gets it only if its schema is already in the strict subset."""
    exact = {
        "type": "object",
        "properties": {"q": {"type": "string"}, "n": {"type": ["integer", "null"]}},
        "required": ["q", "n"],
        "additionalProperties": False,
    }
    loose = {"type": "object", "properties": {"q": {"type": "string"}}}
    registry = Registry(
        [
            ToolSpec.command_tool("exact", "d", ["true"], parameters=exact),
            ToolSpec.command_tool("loose", "d", ["true"], parameters=loose),
        ]
    )
    strict = {s["name"]: s["strict"] for s in registry.schemas("openai-responses", strict=True)}
    assert strict == {"exact": True, "loose": False}
    (exact_schema, _) = registry.schemas("openai-responses", strict=True)
    assert exact_schema["parameters"] == exact


@pytest.mark.parametrize(
    ("schema", "compatible"),
    [
        ({"type": "object", "properties": {}, "additionalProperties": False}, True),
        ({"type": "object", "properties": {}}, False),
        ({"type": "array", "items": {}}, False),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "minLength": 1}},
                "required": ["a"],
                "additionalProperties": False,
            },
            False,
        ),
        (
            {
                "type": "object",
                "properties": {
                    "a": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"b": {"type": "string"}},
                            "additionalProperties": False,
                        },
                    }
                },
                "required": ["a"],
                "additionalProperties": False,
            },
            False,
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                "required": ["a"],
                "additionalProperties": False,
            },
            True,
        ),
    ],
)
def test_strict_compatibility(schema: dict[str, Any], compatible: bool) -> None:
    """Objects at any depth need every property required and no extras; only known keywords."""
    assert strict_compatible(schema) is compatible


def test_mcp_schemas_mark_the_file_tools_read_only(registry: Registry) -> None:
    """read, grep, glob and list are read-only with a title in MCP; declared tools claim nothing."""
    tools = {s["name"]: s for s in registry.schemas("mcp")}
    for name in ("read", "grep", "glob", "list"):
        assert tools[name]["annotations"]["readOnlyHint"] is True
        assert tools[name]["title"]
    assert "annotations" not in tools["species"]


def test_specs_with_different_schemas_are_not_equal() -> None:
    """ToolSpec equality includes the parameters schema, and a spec's schema cannot be changed."""
    one = ToolSpec.command_tool("t", "d", ["true"], parameters={"type": "object"})
    same = ToolSpec.command_tool("t", "d", ["true"], parameters={"type": "object"})
    other = ToolSpec.command_tool(
        "t", "d", ["true"], parameters={"type": "object", "properties": {"x": {"type": "string"}}}
    )
    assert one == same
    assert hash(one) == hash(same)
    assert one != other
    one.parameters["properties"] = {"y": {}}
    assert one == same


def test_a_python_spec_without_its_function_cannot_join() -> None:
    """A Python tool's spec carries its function; one built without it is refused at once."""
    registry = Registry()

    @registry.tool
    def shout(text: str) -> str:
        """Shout the text."""
        return text.upper()

    spec = registry["shout"]
    assert spec.handler is not None
    assert spec.handler.func is shout
    bare = ToolSpec(name="whisper", description="d", kind=ToolKind.PYTHON)
    with pytest.raises(ToolRegistrationError, match="has no function"):
        Registry([bare])

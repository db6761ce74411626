"""Argument checks before anything runs, and the args-mode flags."""

from __future__ import annotations

import pytest

from astralvessel import ToolSpec
from astralvessel._arguments import Refusal, args_argv, check_arguments, parse_arguments

SCHEMA = {
    "type": "object",
    "required": ["path"],
    "properties": {
        "path": {"type": "string"},
        "flag": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "count": {"type": "integer", "minimum": 1},
    },
}
ARGS_TOOL = ToolSpec.command_tool("wc", "Count.", ["wc"], parameters=SCHEMA, input="args")


def refusal(tool: str, arguments: object) -> str:
    with pytest.raises(Refusal) as info:
        parse_arguments(tool, arguments)
    return str(info.value)


@pytest.mark.parametrize("text", ['{"path": ', "{'path': 'a'}", "nope", '{"a": 1} trailing'])
def test_bad_json_tells_model_how_to_call_again(text: str) -> None:
    """Text that is not JSON is refused with how to call again."""
    message = refusal("wc", text)
    assert message.startswith("Error: the arguments for wc are not valid JSON (")
    assert "Call wc again with its arguments as one JSON object" in message


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("[1, 2]", "an array"),
        ('"x"', "a string"),
        ("3", "a number"),
        ("null", "null"),
        ("true", "a boolean"),
    ],
)
def test_json_that_is_not_an_object(text: str, kind: str) -> None:
    """JSON that is not an object is refused, naming what it was."""
    assert f"must be a JSON object, not {kind}" in refusal("wc", text)


def test_dict_and_text_both_accepted() -> None:
    """A dict passes through; raw JSON text is decoded; empty means no arguments."""
    assert parse_arguments("wc", {"path": "a"}) == {"path": "a"}
    assert parse_arguments("wc", '{"path": "a"}') == {"path": "a"}
    assert parse_arguments("wc", b'{"path": "a"}') == {"path": "a"}
    assert parse_arguments("wc", "") == {}
    assert parse_arguments("wc", None) == {}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "Error: invalid arguments for wc: 'path' is a required property."),
        ({"path": 5}, "Error: invalid arguments for wc at 'path': 5 is not of type 'string'."),
        ({"path": "a", "count": 0}, "at 'count': 0 is less than the minimum of 1."),
        ({"path": "a", "tags": ["x", 2]}, "at 'tags/1': 2 is not of type 'string'."),
    ],
)
def test_schema_failures_name_the_path(arguments: dict[str, object], expected: str) -> None:
    """Arguments failing the schema are refused with the validator's message and path."""
    with pytest.raises(Refusal) as info:
        check_arguments(ARGS_TOOL, arguments)
    assert expected in str(info.value)
    assert "Call wc again with arguments that match its parameters schema." in str(info.value)


def test_args_mode_refuses_undeclared_names() -> None:
    """In args mode, a name not declared under properties is refused even if the schema allows it."""
    with pytest.raises(Refusal) as info:
        check_arguments(ARGS_TOOL, {"path": "a", "exec": "rm -rf /"})
    assert str(info.value) == (
        "Error: wc does not accept the argument 'exec'; it accepts: path, flag, tags, count. "
        "Call wc again with only those."
    )


def test_args_flags_use_python_str_in_declared_order() -> None:
    """Each value is rendered with str(), one argv element per flag, in schema order."""
    argv = args_argv(ARGS_TOOL, {"tags": ["a", "b"], "flag": True, "path": "x y;$(id)", "count": 3})
    assert argv == ["--path=x y;$(id)", "--flag=True", "--tags=['a', 'b']", "--count=3"]


def test_json_stdin_mode_allows_extra_names_the_schema_allows() -> None:
    """json-stdin tools accept what their schema accepts (no args-mode name check)."""
    spec = ToolSpec.command_tool("t", "d", ["x"], parameters={"type": "object"})
    check_arguments(spec, {"anything": 1})

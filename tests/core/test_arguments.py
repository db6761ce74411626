"""Argument checks before anything runs, and the args-mode flags."""

from __future__ import annotations

import pytest

from astralvessel import ToolSpec
from astralvessel._tools._arguments import Refusal, args_argv, check_arguments, parse_arguments

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


@pytest.mark.parametrize("value", [(1, 2), object()], ids=["tuple", "object"])
def test_python_values_that_are_not_json_are_named_by_type(value: object) -> None:
    """A non-JSON Python value is refused naming its type (it was called a string)."""
    with pytest.raises(Refusal, match=f"not a {type(value).__name__}, which is not JSON"):
        parse_arguments("wc", value)


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


# -- bounds: hostile arguments are refusals, never exceptions --------------------------

FREE_TOOL = ToolSpec.command_tool("t", "d", ["x"], parameters={"type": "object"})
FREE_ARGS_TOOL = ToolSpec.command_tool(
    "a", "d", ["x"], parameters={"type": "object", "properties": {"v": {}}}, input="args"
)


def refused(spec: ToolSpec, arguments: object) -> str:
    with pytest.raises(Refusal) as info:
        check_arguments(spec, parse_arguments(spec.name, arguments))
    return str(info.value)


def test_deep_json_text_is_refused_not_a_recursion_error() -> None:
    """JSON nested far deeper than Python's recursion limit is a refusal."""
    assert "nested deeper than 64 levels" in refused(FREE_TOOL, "[" * 100_000 + "]" * 100_000)


def test_moderately_deep_arguments_are_refused_by_the_walk() -> None:
    """Nesting that json can parse but that passes the depth bound is refused too."""
    text = '{"v": ' + "[" * 200 + "]" * 200 + "}"
    assert "nested deeper than 64 levels" in refused(FREE_TOOL, text)


def test_deep_dict_from_the_host_is_refused() -> None:
    """A deep structure handed over as a dict (no JSON text) is walked without recursion."""
    deep: object = []
    for _ in range(5000):
        deep = [deep]
    assert "nested deeper than 64 levels" in refused(FREE_TOOL, {"v": deep})


@pytest.mark.parametrize("text", ['{"v": "\\ud800"}', '{"\\udfff": 1}'])
def test_lone_surrogate_is_refused(text: str) -> None:
    """Text no UTF-8 encoder accepts (a lone surrogate, in a value or a name) is refused."""
    assert "not valid Unicode" in refused(FREE_TOOL, text)


def test_huge_integer_is_refused_as_text_and_as_a_value() -> None:
    """A 5000-digit integer is refused whether it arrives as JSON text or as a Python int."""
    assert "more than 1000 digits" in refused(FREE_TOOL, '{"v": ' + "9" * 5000 + "}")
    assert "more than 1000 digits" in refused(FREE_TOOL, {"v": 10**2000})
    check_arguments(FREE_TOOL, {"v": 10**999})


def test_non_finite_numbers_are_refused() -> None:
    """NaN and Infinity are not JSON numbers, so no tool receives them."""
    assert "not a JSON number" in refused(FREE_TOOL, '{"v": NaN}')
    assert "not a JSON number" in refused(FREE_TOOL, {"v": float("-inf")})


def test_arguments_over_one_mebibyte_are_refused_before_parsing() -> None:
    """Two megabytes of arguments are refused with the bound, text or dict."""
    big = "x" * (2 << 20)
    assert f"at most {1 << 20} are accepted" in refused(FREE_TOOL, '{"v": "' + big + '"}')
    assert f"at most {1 << 20} are accepted" in refused(FREE_TOOL, {"v": big})


def test_nul_is_refused_where_arguments_travel_in_argv() -> None:
    """A NUL in an args-mode value is refused; json-stdin tools receive it escaped."""
    assert "NUL character" in refused(FREE_ARGS_TOOL, {"v": "a\0b"})
    check_arguments(FREE_TOOL, {"v": "a\0b"})


def test_argv_text_over_the_kernel_limit_is_refused() -> None:
    """Args-mode text over 128 KiB (one argv string's limit) is refused; stdin tools take more."""
    assert "at most 131072" in refused(FREE_ARGS_TOOL, {"v": "x" * 200_000})
    check_arguments(FREE_TOOL, {"v": "x" * 200_000})


def test_a_long_validator_message_does_not_echo_the_value() -> None:
    """A schema failure quoting a huge value is cut, so the model is not sent it back."""
    spec = ToolSpec.command_tool(
        "n", "d", ["x"], parameters={"type": "object", "properties": {"v": {"type": "integer"}}}
    )
    message = refused(spec, {"v": "y" * 500_000})
    assert len(message) < 1000


def test_one_validator_per_schema() -> None:
    """Checking the same schema twice reuses its validator (issue 11, point 6)."""
    from astralvessel._tools import _arguments

    check_arguments(ARGS_TOOL, {"path": "a"})
    before = _arguments._validator.cache_info().hits
    check_arguments(ARGS_TOOL, {"path": "b"})
    assert _arguments._validator.cache_info().hits == before + 1


def test_dangling_ref_is_the_hosts_error() -> None:
    """A schema whose $ref resolves nowhere raises ConfigError, not a jsonschema traceback."""
    from astralvessel import ConfigError
    from astralvessel._tools._arguments import schema_problem

    schema = {"type": "object", "properties": {"v": {"$ref": "#/$defs/missing"}}}
    spec = ToolSpec.command_tool("r", "d", ["x"], parameters=schema)
    assert "cannot be used to check arguments" in str(schema_problem(schema))
    with pytest.raises(ConfigError, match="tool r: parameters"):
        check_arguments(spec, {"v": 1})

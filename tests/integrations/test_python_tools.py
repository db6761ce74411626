"""Python tools: schemas derived from typed functions, arguments structured, results shaped."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from typing import Annotated, Any, Literal

import anyio
import attrs
import pytest
import trio

import astralvessel as av
from astralvessel._tools._pytools import ToolError, parse_docstring, schema_for
from astralvessel.sandbox._base import Sandbox


class Habitat(enum.Enum):
    """Where a species lives."""

    RIVERS = "rivers"
    COASTS = "coasts"


@attrs.frozen
class Window:
    """A range of lengths."""

    low: int
    high: int = attrs.field(default=500, metadata={"description": "Upper bound in cm."})


@dataclasses.dataclass
class Point:
    x: float
    y: float = 0.0


def test_schema_from_signature_and_google_docstring() -> None:
    """Parameter types, defaults, required names and Google-style notes make the schema."""
    registry = av.Registry()

    @registry.tool
    def find(habitat: Habitat, limit: int = 5, exact: bool = False) -> str:
        """Find species by habitat.

        Args:
            habitat: Where to look.
            limit: How many to return,
                at most.
        """
        return ""

    spec = registry["find"]
    assert spec.kind is av.ToolKind.PYTHON
    assert spec.description == "Find species by habitat."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "habitat": {
                "description": "Where to look.",
                "type": "string",
                "enum": ["rivers", "coasts"],
            },
            "limit": {
                "description": "How many to return, at most.",
                "type": "integer",
                "default": 5,
            },
            "exact": {"type": "boolean", "default": False},
        },
        "required": ["habitat"],
        "additionalProperties": False,
    }


def test_schema_for_literal_optional_list_and_annotated() -> None:
    """Literal becomes an enum, ``X | None`` an anyOf with null, lists arrays, Annotated a note."""
    assert schema_for(Literal["a", "b"]) == {"type": "string", "enum": ["a", "b"]}
    assert schema_for(int | None) == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert schema_for(list[str]) == {"type": "array", "items": {"type": "string"}}
    assert schema_for(set[int]) == {
        "type": "array",
        "items": {"type": "integer"},
        "uniqueItems": True,
    }
    assert schema_for(dict[str, float]) == {
        "type": "object",
        "additionalProperties": {"type": "number"},
    }
    assert schema_for(Annotated[str, "A page name."]) == {
        "description": "A page name.",
        "type": "string",
    }
    assert schema_for(tuple[int, str])["prefixItems"] == [{"type": "integer"}, {"type": "string"}]


def test_schema_for_attrs_class_and_dataclass() -> None:
    """attrs classes and dataclasses become closed objects with their own required fields."""
    assert schema_for(Window) == {
        "description": "A range of lengths.",
        "type": "object",
        "properties": {
            "low": {"type": "integer"},
            "high": {"description": "Upper bound in cm.", "type": "integer"},
        },
        "required": ["low"],
        "additionalProperties": False,
    }
    assert schema_for(Point)["required"] == ["x"]


def test_numpy_and_sphinx_docstrings() -> None:
    """NumPy and Sphinx parameter sections give per-parameter descriptions too."""
    numpy_doc = "Summary.\n\nParameters\n----------\nhabitat : str\n    Where to look.\n"
    sphinx_doc = "Summary.\n\n:param habitat: Where to look.\n:returns: rows\n"
    assert parse_docstring(numpy_doc) == ("Summary.", {"habitat": "Where to look."})
    assert parse_docstring(sphinx_doc) == ("Summary.", {"habitat": "Where to look."})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x):\n    'Doc.'", "has no type hint"),
        ("def f(*args: int) -> None:\n    'Doc.'", r"takes \*args"),
        ("def f(x: int) -> None:\n    pass", "has no description"),
        ("def f(x: object) -> None:\n    'Doc.'", "cannot describe"),
        ("def Bad(x: int) -> None:\n    'Doc.'", "not a valid tool name"),
        ("def read(x: int) -> None:\n    'Doc.'", "built-in tool's name"),
        ("def f(x: dict[int, str]) -> None:\n    'Doc.'", "keys are strings"),
    ],
)
def test_underivable_functions_are_refused(source: str, message: str) -> None:
    """A function whose tool cannot be derived raises ToolRegistrationError saying why."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - building test functions from short literal sources
    func = next(v for k, v in namespace.items() if k != "__builtins__")
    with pytest.raises(av.ToolRegistrationError, match=message):
        av.Registry().tool(func)


def test_decorator_options_and_duplicate_names() -> None:
    """``tool(...)`` takes a name, description and scope; a second tool of one name is refused."""
    registry = av.Registry()

    @registry.tool(name="lookup", description="Look a page up.", scope="tools:files")
    def anything(page: str) -> str:
        return page

    assert anything("x") == "x"  # the function itself is returned unchanged
    assert registry["lookup"].scope is av.Scope.FILES
    with pytest.raises(av.ToolRegistrationError, match="already registered"):
        registry.tool(name="lookup", description="Again.")(anything)


@pytest.fixture
def executor(backend: Sandbox) -> av.Executor:
    """An executor over a registry of Python tools (none of them starts the sandbox)."""
    registry = av.Registry()

    @registry.tool
    def measure(window: Window, habitat: Habitat = Habitat.RIVERS) -> dict[str, Any]:
        """Describe a window."""
        assert isinstance(window, Window)
        assert isinstance(habitat, Habitat)
        return {"low": window.low, "high": window.high, "habitat": habitat.value}

    @registry.tool
    def refuse(reason: str) -> str:
        """Always fails."""
        raise ToolError(f"cannot do that: {reason}")

    @registry.tool
    def crash() -> str:
        """A bug in the host's code."""
        raise KeyError("host bug")

    @registry.tool
    def nothing() -> None:
        """Returns nothing."""

    @registry.tool
    def big(size: int) -> str:
        """Returns a lot."""
        return "x" * size

    @registry.tool(timeout_seconds=0.2)
    async def hang() -> str:
        """Never finishes."""
        await anyio.Event().wait()  # on whichever loop runs the call
        return "unreachable"

    @registry.tool
    async def own_timeout() -> str:
        """Raises TimeoutError itself."""
        raise TimeoutError("the database timed out")

    @registry.tool
    async def shout(text: str) -> str:
        """Upper-cases text."""
        await anyio.sleep(0)
        return text.upper()

    return av.Executor(registry, sandbox=backend, output_chars=100)


def test_arguments_are_structured_into_hinted_types(executor: av.Executor) -> None:
    """Nested attrs classes and enums arrive built; a dict result reaches the model as JSON."""
    with executor.turn() as turn:
        result = turn.call("measure", '{"window": {"low": 3}, "habitat": "coasts"}')
    assert not result.is_error
    assert result.text == '{"low": 3, "high": 500, "habitat": "coasts"}'


def test_arguments_outside_the_schema_are_refused(executor: av.Executor) -> None:
    """An argument the function does not take is refused before it runs."""
    with executor.turn() as turn:
        result = turn.call("measure", {"window": {"low": 1}, "colour": "red"})
    assert result.is_error
    assert "colour" in result.text


def test_tool_error_reaches_the_model(executor: av.Executor) -> None:
    """ToolError's message becomes an error result."""
    with executor.turn() as turn:
        result = turn.call("refuse", {"reason": "no data"})
    assert result.is_error
    assert result.text == "cannot do that: no data"


def test_other_exceptions_reach_the_host(executor: av.Executor) -> None:
    """Any exception but ToolError propagates out of the call, sync and async."""
    with executor.turn() as turn, pytest.raises(KeyError, match="host bug"):
        turn.call("crash")

    async def main() -> None:
        async with executor.turn() as turn:
            await turn.acall("crash")

    with pytest.raises(KeyError, match="host bug"):
        asyncio.run(main())


def test_none_and_long_results(executor: av.Executor) -> None:
    """None shows ``[no output]``; text past the output cap is cut with a note."""
    with executor.turn() as turn:
        empty = turn.call("nothing")
        long = turn.call("big", {"size": 250})
    assert empty.text == "[no output]"
    assert long.text == "x" * 100 + "\n[output truncated: 150 more characters were dropped]"
    assert long.dropped_chars == 150


def test_async_tool_past_its_timeout(executor: av.Executor) -> None:
    """An async tool is cancelled at its timeout and the model is told, sync and async."""
    with executor.turn() as turn:
        result = turn.call("hang")
    assert result.timed_out
    assert result.is_error
    assert result.text == "[timed out after 0.2 s]"

    async def main() -> av.ToolResult:
        async with executor.turn() as turn:
            return await turn.acall("hang")

    assert asyncio.run(main()).text == "[timed out after 0.2 s]"


def test_tools_own_timeout_error_is_not_a_timeout(executor: av.Executor) -> None:
    """A TimeoutError the tool raises itself is the host's exception, not a call timeout."""
    with executor.turn() as turn, pytest.raises(TimeoutError, match="database"):
        turn.call("own_timeout")


def test_async_tool_called_from_sync_code_inside_a_loop(executor: av.Executor) -> None:
    """A sync call of an async tool works even from inside a running event loop."""

    async def main() -> av.ToolResult:
        with executor.turn() as turn:
            return turn.call("shout", {"text": "otter"})

    assert asyncio.run(main()).text == "OTTER"


def test_sync_tool_through_acall(executor: av.Executor) -> None:
    """A sync tool called with ``acall`` runs in a worker thread and returns normally."""

    async def main() -> av.ToolResult:
        async with executor.turn() as turn:
            return await turn.acall("measure", {"window": {"low": 1, "high": 2}})

    assert asyncio.run(main()).text == '{"low": 1, "high": 2, "habitat": "rivers"}'


def test_python_tools_under_trio(executor: av.Executor) -> None:
    """A trio host awaits async and sync Python tools; timeouts and host errors hold there too."""

    async def main() -> list[av.ToolResult]:
        async with executor.turn() as turn:
            results = [
                await turn.acall("shout", {"text": "otter"}),
                await turn.acall("measure", {"window": {"low": 1, "high": 2}}),
                await turn.acall("refuse", {"reason": "no data"}),
                await turn.acall("hang"),
            ]
            with pytest.raises(KeyError, match="host bug"):
                await turn.acall("crash")
            return results

    shout, measure, refuse, hang = trio.run(main)
    assert shout.text == "OTTER"
    assert measure.text == '{"low": 1, "high": 2, "habitat": "rivers"}'
    assert refuse.is_error
    assert refuse.text == "cannot do that: no data"
    assert hang.timed_out
    assert hang.text == "[timed out after 0.2 s]"


def test_trio_cancels_an_async_python_tool(executor: av.Executor) -> None:
    """A trio cancel reaches an async Python tool at once, and the turn goes on working."""

    finished: list[av.ToolResult] = []

    async def main() -> tuple[bool, av.ToolResult]:
        async with executor.turn() as turn:

            async def hang() -> None:
                finished.append(await turn.acall("hang"))  # its own timeout would end it

            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hang)
                    await trio.sleep(0.05)
                    scope.cancel()
            return scope.cancelled_caught, await turn.acall("shout", {"text": "after"})

    cancelled, after = trio.run(main)
    assert cancelled
    assert finished == []
    assert after.text == "AFTER"


def test_python_tools_follow_granted_scopes(backend: Sandbox) -> None:
    """A Python tool outside the executor's scopes is neither listed nor callable."""
    registry = av.Registry()

    @registry.tool(scope=av.Scope.EXECUTE)
    def launch() -> str:
        """Does something powerful."""
        return "launched"

    executor = av.Executor(registry, sandbox=backend, scopes=["tools:read"])
    assert registry.schemas("openai", scopes=executor.scopes) == []
    with executor.turn() as turn:
        assert turn.call("launch").is_error

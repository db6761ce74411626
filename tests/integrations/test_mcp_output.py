"""MCP output schemas: a Python tool's return annotation, listed and held to, checked by the mcp client."""

from __future__ import annotations

from typing import Any

import anyio
import attrs
import pytest
from mcp import Client

import astralvessel as av
from astralvessel.mcp_server import create_server
from astralvessel.sandbox._base import Sandbox


@attrs.frozen
class Sighting:
    """One sighting of a species."""

    species: str
    count: int
    habitat: str = "rivers"


@pytest.fixture
def executor(backend: Sandbox) -> av.Executor:
    """Python tools returning an object, a lie about their object, a long object, and text."""
    registry = av.Registry()
    registry.add_builtin("read")

    @registry.tool
    def sight(species: str, count: int) -> Sighting:
        """Record a sighting."""
        return Sighting(species=species, count=count)

    @registry.tool
    def tally(species: str) -> dict[str, int]:
        """Count sightings by place, as many places as there are."""
        places = 400 if species == "gull" else 2
        return {f"place-{i}": i for i in range(places)}

    @registry.tool
    def mislabelled() -> Sighting:
        """Claims a Sighting, returns something else (a bug in the host's tool)."""
        return {"species": "otter", "count": "several"}  # type: ignore[return-value]

    @registry.tool
    def shout(text: str) -> str:
        """Upper-cases text."""
        return text.upper()

    return av.Executor(registry, sandbox=backend, output_chars=2000)


async def _session(executor: av.Executor, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    async with executor.turn() as turn, Client(create_server(turn)) as client:
        listed = await client.list_tools()
        # The mcp client checks every successful result against the tool's outputSchema.
        results = [await client.call_tool(name, arguments) for name, arguments in calls]
    return {tool.name: tool for tool in listed.tools}, results


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_object_returns_are_listed_and_sent_as_structured_content(
    executor: av.Executor, loop: str
) -> None:
    """A tool returning an attrs object or a dict lists its outputSchema; results fit it."""
    calls = [("sight", {"species": "otter", "count": 3}), ("tally", {"species": "heron"})]
    tools, (sighting, tally) = anyio.run(_session, executor, calls, backend=loop)
    assert tools["sight"].output_schema == {
        "description": "One sighting of a species.",
        "type": "object",
        "properties": {
            "species": {"type": "string"},
            "count": {"type": "integer"},
            "habitat": {"type": "string"},
        },
        "required": ["species", "count"],
        "additionalProperties": False,
    }
    assert tools["tally"].output_schema == {
        "type": "object",
        "additionalProperties": {"type": "integer"},
    }
    assert tools["shout"].output_schema is None
    assert tools["read"].output_schema is None
    assert not sighting.is_error
    assert sighting.structured_content == {"species": "otter", "count": 3, "habitat": "rivers"}
    assert tally.structured_content == {"place-0": 0, "place-1": 1}


def test_a_result_that_breaks_its_schema_is_an_error_result(executor: av.Executor) -> None:
    """A tool whose value does not fit its own annotation gets an error result saying why."""
    _, (result,) = anyio.run(_session, executor, [("mislabelled", {})])
    assert result.is_error
    assert result.structured_content is None
    (block,) = result.content
    assert block.text.startswith('{"species": "otter", "count": "several"}\n')
    assert "not the JSON object the tool's output schema describes" in block.text
    assert "'several' is not of type 'integer'" in block.text


def test_output_cut_at_the_cap_is_an_error_result(executor: av.Executor) -> None:
    """An object cut at the output cap is no longer that object: an error result says so."""
    _, (result,) = anyio.run(_session, executor, [("tally", {"species": "gull"})])
    assert result.is_error
    (block,) = result.content
    assert "[output truncated:" in block.text
    assert block.text.endswith("it was cut at the output cap]")


def test_text_tools_keep_plain_results(executor: av.Executor) -> None:
    """A tool without an output schema answers with text only, as before."""
    _, (result,) = anyio.run(_session, executor, [("shout", {"text": "otter"})])
    assert not result.is_error
    assert result.structured_content is None
    assert result.content[0].text == "OTTER"

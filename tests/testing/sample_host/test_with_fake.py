"""The sample host on a fake sandbox: no sandbox starts, the results read as in production."""

from __future__ import annotations

import pytest

import astralvessel as av
from astralvessel.testing import FakeCall, FakeRun, FakeSandbox, ScriptedModel, tool_call

from .host import ask

pytestmark = pytest.mark.vessel_agent("agent", mounts={"/data": "data"})


def pool(call: FakeCall) -> str | FakeRun:
    """What the real pool tool prints, for the pools this test knows."""
    if call.arguments["name"] == "north":
        return "depth: 40 cm\nlives here: anemones, shore crabs\n"
    return FakeRun(output="There is no pool called 'west'; the pools are: north\n", exit_code=1)


@pytest.fixture
def vessel_sandbox() -> FakeSandbox:
    """A fake sandbox that answers the pool tool; read and list see the mounted pages."""
    return FakeSandbox(tools={"pool": pool})


def test_declared_tool_answers_from_the_fake(
    vessel_turn: av.Turn, vessel_sandbox: FakeSandbox
) -> None:
    """The pool tool's answer comes from the fake, and the call is recorded as it would run."""
    result = vessel_turn.call("pool", {"name": "north"})
    assert result.text == "depth: 40 cm\nlives here: anemones, shore crabs\n"
    (call,) = vessel_sandbox.calls
    assert call.argv == ("python3", "/agent/tools/pool.py")
    assert call.stdin == b'{"name": "north"}'


def test_a_failing_tool_is_an_error_result(vessel_turn: av.Turn) -> None:
    """A non-zero exit is an error result with the tool's own words."""
    result = vessel_turn.call("pool", {"name": "west"})
    assert result.is_error
    assert result.text.startswith("There is no pool called 'west'")


def test_bad_arguments_never_reach_the_sandbox(
    vessel_turn: av.Turn, vessel_sandbox: FakeSandbox
) -> None:
    """A call missing its required argument is refused before anything runs."""
    result = vessel_turn.call("pool", {})
    assert result.is_error
    assert "'name' is a required property" in result.text
    assert vessel_sandbox.calls == []


def test_file_tools_read_the_mounted_pages(vessel_turn: av.Turn) -> None:
    """read and list see the host's mounted folder through the fake."""
    assert vessel_turn.call("list", {}).text == "north.txt\nsouth.txt"
    assert vessel_turn.call("read", {"path": "south.txt"}).text.startswith("1\tdepth: 15 cm")


def test_the_loop_on_the_fake(vessel_executor: av.Executor, vessel_sandbox: FakeSandbox) -> None:
    """The host's loop runs a scripted model's calls on the fake and sends back each result."""
    model = ScriptedModel(
        "openai",
        [
            [tool_call("pool", {"name": "north"}), tool_call("to_inches", {"centimetres": 40})],
            "The north pool is 40 cm (15.7 in) deep.",
        ],
    )
    conversation = ask(model, vessel_executor, "How deep is the north pool?")
    assert [(a.name, a.text) for a in model.answers()] == [
        ("pool", "depth: 40 cm\nlives here: anemones, shore crabs\n"),
        ("to_inches", "15.7 in"),
    ]
    assert conversation["messages"][-1]["content"] == "The north pool is 40 cm (15.7 in) deep."
    assert [c.tool for c in vessel_sandbox.calls] == ["pool"]  # to_inches ran in the host
    assert vessel_sandbox.open_sessions == 0  # the loop closed its turn

"""The sample host on a real sandbox: the tools run confined, as in production."""

from __future__ import annotations

import pytest

import astralvessel as av

pytestmark = pytest.mark.vessel_agent("agent", mounts={"/data": "data"})


def test_declared_tool_runs_in_the_sandbox(vessel_turn: av.Turn) -> None:
    """The pool tool reads its page from the mounted folder inside the sandbox."""
    result = vessel_turn.call("pool", {"name": "north"})
    assert (result.text, result.is_error) == (
        "depth: 40 cm\nlives here: anemones, shore crabs\n",
        False,
    )
    assert result.backend == vessel_turn.executor.sandbox.name
    assert vessel_turn.executor.sandbox.confined  # the fixtures' default is a confined backend


def test_unknown_pool_is_an_error_result(vessel_turn: av.Turn) -> None:
    """The tool's own error text reaches the model, marked as an error."""
    result = vessel_turn.call("pool", {"name": "west"})
    assert result.is_error
    assert result.text == "There is no pool called 'west'; the pools are: north, south\n"


def test_python_tool_runs_in_the_host(vessel_turn: av.Turn) -> None:
    """The host's Python tool answers in the host, not in the sandbox."""
    result = vessel_turn.call("to_inches", {"centimetres": 15})
    assert (result.text, result.backend) == ("5.9 in", None)


def test_the_workdir_is_the_mounted_data(vessel_turn: av.Turn) -> None:
    """list and read see the pages at the agent's workdir."""
    assert vessel_turn.call("list", {}).text == "north.txt\nsouth.txt"


@pytest.mark.vessel_agent(
    {
        "vessel.toml": '[tools]\nbuiltin = ["list"]\ndeclared = ["t.toml"]\n',
        "t.toml": 'name = "hello"\ndescription = "Say hello."\ncommand = ["echo", "hello"]\n',
    }
)
def test_an_agent_built_from_files(vessel_turn: av.Turn) -> None:
    """An agent written from a dict of files in tmp_path runs like a folder in the repository."""
    assert vessel_turn.call("hello").text == "hello\n"

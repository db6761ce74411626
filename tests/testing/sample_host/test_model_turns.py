"""The sample host's loop driven by scripted model turns, in each API's shape, on a real sandbox."""

from __future__ import annotations

import pytest

import astralvessel as av
from astralvessel.testing import ScriptedModel, tool_call

from .host import APIS, ask

pytestmark = pytest.mark.vessel_agent("agent", mounts={"/data": "data"})


@pytest.mark.parametrize("dialect", list(APIS))
def test_the_loop_answers_every_call(vessel_executor: av.Executor, dialect: str) -> None:
    """Two rounds of tool calls, one failing, then a final answer: the loop answers each call."""
    model = ScriptedModel(
        dialect,
        [
            tool_call("pool", {"name": "west"}),
            [tool_call("pool", {"name": "north"}), tool_call("to_inches", {"centimetres": 40})],
            "The north pool is 40 cm (15.7 in) deep.",
        ],
    )
    ask(model, vessel_executor, "How deep is the west pool?", dialect=dialect)
    answers = model.answers()
    assert [(a.name, a.text) for a in answers] == [
        ("pool", "There is no pool called 'west'; the pools are: north, south\n"),
        ("pool", "depth: 40 cm\nlives here: anemones, shore crabs\n"),
        ("to_inches", "15.7 in"),
    ]
    # Only Anthropic's API carries an error flag; the others tell errors by their text.
    flags = [a.is_error for a in answers]
    assert flags == ([True, False, False] if dialect == "anthropic" else [None, None, None])
    assert model.exhausted
    assert model.requests[0]["tools"] == vessel_executor.registry.schemas(dialect)  # type: ignore[arg-type]


@pytest.mark.parametrize("dialect", list(APIS))
def test_malformed_arguments_reach_the_model_as_an_error(
    vessel_executor: av.Executor, dialect: str
) -> None:
    """Arguments the model garbled come back as an error the model can act on."""
    garbled = "{not json" if dialect != "anthropic" else {"nmae": "north"}
    model = ScriptedModel(dialect, [tool_call("pool", garbled), "Sorry."])
    ask(model, vessel_executor, "North?", dialect=dialect)
    (answer,) = model.answers()
    assert answer.text.startswith("Error:")

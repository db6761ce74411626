"""ScriptedModel: replies in each API's shape, records requests, reads back the loop's answers."""

from __future__ import annotations

from typing import Any

import pytest

from astralvessel import UsageError
from astralvessel.adapters import anthropic, openai
from astralvessel.testing import ScriptedModel, UnscriptedCallError, tool_call


def test_chat_reply_shape() -> None:
    """A Chat Completions reply carries the calls as function tool calls with JSON arguments."""
    model = ScriptedModel("openai", [tool_call("pool", {"name": "north"}), "done"])
    reply = model.chat.completions.create(messages=[], tools=[])
    (parsed,) = openai.chat_tool_calls(reply)
    assert (parsed.id, parsed.name, parsed.arguments) == ("call_1", "pool", '{"name": "north"}')
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    final = model.create(messages=[])
    assert final["choices"][0]["message"] == {"role": "assistant", "content": "done"}
    assert final["choices"][0]["finish_reason"] == "stop"


def test_responses_reply_shape() -> None:
    """A Responses reply has text before its function_call items, each with a call_id."""
    model = ScriptedModel(
        "openai-responses", [["Looking.", tool_call("a"), tool_call("b", id="x")]]
    )
    reply = model.responses.create(input=[])
    assert [item["type"] for item in reply["output"]] == [
        "message",
        "function_call",
        "function_call",
    ]
    assert [c.id for c in openai.responses_tool_calls(reply)] == ["call_1", "x"]
    assert reply["output_text"] == "Looking."


def test_anthropic_reply_shape() -> None:
    """An Anthropic reply carries tool_use blocks with object input and stop_reason tool_use."""
    model = ScriptedModel("anthropic", [tool_call("pool", {"name": "north"}), "done"])
    reply = model.messages.create(messages=[])
    (parsed,) = anthropic.tool_calls(reply)
    assert (parsed.id, parsed.arguments) == ("toolu_1", {"name": "north"})
    assert reply["stop_reason"] == "tool_use"
    assert model.create(messages=[])["stop_reason"] == "end_turn"


def test_requests_are_recorded_as_sent() -> None:
    """Each request is kept as it was when sent, even if the loop changes its list later."""
    model = ScriptedModel("openai", ["one", "two"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    model.create(messages=messages)
    messages.append({"role": "assistant", "content": "one"})
    model.create(messages=messages)
    assert [len(r["messages"]) for r in model.requests] == [1, 2]


def test_a_function_step_sees_the_request() -> None:
    """A step may be a function of the request, to answer from what the loop sent."""
    model = ScriptedModel("openai", [lambda request: f"{len(request['messages'])} messages"])
    reply = model.create(messages=[{}, {}])
    assert reply["choices"][0]["message"]["content"] == "2 messages"


def test_past_the_script_is_an_unscripted_call() -> None:
    """A loop that asks again after the final answer fails with UnscriptedCallError."""
    model = ScriptedModel("anthropic", ["done"])
    model.create(messages=[])
    assert model.exhausted
    with pytest.raises(UnscriptedCallError, match="2nd time"):
        model.create(messages=[])


def test_unanswered_calls_fail_answers() -> None:
    """answers() names a call the loop never answered."""
    model = ScriptedModel("openai", [[tool_call("a"), tool_call("b")], "done"])
    model.create(messages=[])
    model.create(messages=[{"role": "tool", "tool_call_id": "call_1", "content": "A"}])
    with pytest.raises(AssertionError, match=r"b \(call_2\)"):
        model.answers()


def test_anthropic_answers_carry_the_error_flag() -> None:
    """Anthropic tool_result blocks are read back with their text blocks and is_error."""
    model = ScriptedModel("anthropic", [tool_call("a"), "done"])
    model.create(messages=[])
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "bad"}],
        "is_error": True,
    }
    model.create(messages=[{"role": "user", "content": [result]}])
    (answer,) = model.answers()
    assert (answer.name, answer.text, answer.is_error) == ("a", "bad", True)


def test_bad_script_steps_and_dialects_are_refused() -> None:
    """An unknown dialect, or a step that is not text or calls, is a UsageError."""
    with pytest.raises(UsageError):
        ScriptedModel("gemini", [])
    with pytest.raises(UsageError):
        ScriptedModel("openai", [42]).create(messages=[])  # type: ignore[list-item]

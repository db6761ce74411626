"""OpenAI adapters: Chat Completions and Responses, as plain dicts.

Chat Completions::

    message = response["choices"][0]["message"]
    messages.append(message)
    messages += run_chat_tool_calls(turn, message)      # one "tool" message per call

Responses::

    items += response["output"]
    items += run_responses_tool_calls(turn, response)   # one function_call_output per call

The calls of one response run concurrently in the turn (``arun_*`` with
``acall`` on one task group (asyncio or trio), ``run_*`` on threads).
"""

from __future__ import annotations

from collections import abc
from typing import TYPE_CHECKING, Any

from . import _common

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ..executor import Turn
    from ..results import ToolResult

__all__ = [
    "arun_chat_tool_calls",
    "arun_responses_tool_calls",
    "chat_tool_calls",
    "chat_tool_messages",
    "responses_tool_calls",
    "responses_tool_outputs",
    "run_chat_tool_calls",
    "run_responses_tool_calls",
]


# -- Chat Completions -----------------------------------------------------------------------


def chat_tool_calls(response: object) -> list[_common.ToolCall]:
    """The tool calls in a Chat Completions response or its assistant message, in order.

    Accepts the whole response (its first choice is read) or the ``message``.
    """
    data = _common.as_dict(response, "a Chat Completions response or message")
    if "choices" in data:
        choices = data["choices"] or [{}]
        data = _common.as_dict(choices[0].get("message") or {}, "choices[0].message")
    calls = []
    for item in data.get("tool_calls") or ():
        call = _common.as_dict(item, "a tool call")
        kind = call.get("type", "function")
        body: Mapping[str, Any] = call.get(kind) or call.get("function") or {}
        # Custom (free-form) tools carry "input" text; function tools carry "arguments".
        arguments = body.get("arguments", body.get("input"))
        calls.append(
            _common.ToolCall(
                id=str(call.get("id", "")), name=str(body.get("name", "")), arguments=arguments
            )
        )
    return calls


def chat_tool_messages(
    calls: Sequence[_common.ToolCall], results: Sequence[ToolResult]
) -> list[dict[str, Any]]:
    """One ``{"role": "tool"}`` message per call, answering it by ``tool_call_id``.

    Chat Completions has no error flag, so an error result is told by its text
    (every error the library writes says what went wrong).
    """
    return [
        {"role": "tool", "tool_call_id": call.id, "content": result.text}
        for call, result in zip(calls, results, strict=True)
    ]


def run_chat_tool_calls(turn: Turn, response: object) -> list[dict[str, Any]]:
    """Run every tool call of a Chat Completions response; return the tool messages."""
    calls = chat_tool_calls(response)
    return chat_tool_messages(calls, _common.run_calls(turn, calls))


async def arun_chat_tool_calls(turn: Turn, response: object) -> list[dict[str, Any]]:
    """Async twin of ``run_chat_tool_calls``: the calls run concurrently with ``acall``."""
    calls = chat_tool_calls(response)
    return chat_tool_messages(calls, await _common.arun_calls(turn, calls))


# -- Responses ------------------------------------------------------------------------------


def responses_tool_calls(response: object) -> list[_common.ToolCall]:
    """The ``function_call`` items of a Responses API response (or its ``output`` list)."""
    if isinstance(response, abc.Sequence) and not isinstance(response, (str, bytes)):
        items: Sequence[Any] = response
    else:
        items = _common.as_dict(response, "a Responses API response").get("output") or ()
    calls = []
    for raw in items:
        item = _common.as_dict(raw, "an output item")
        if item.get("type") in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments", item.get("input"))
            calls.append(
                _common.ToolCall(
                    id=str(item.get("call_id", "")),
                    name=str(item.get("name", "")),
                    arguments=arguments,
                )
            )
    return calls


def responses_tool_outputs(
    calls: Sequence[_common.ToolCall], results: Sequence[ToolResult]
) -> list[dict[str, Any]]:
    """One ``function_call_output`` input item per call, answering it by ``call_id``."""
    return [
        {"type": "function_call_output", "call_id": call.id, "output": result.text}
        for call, result in zip(calls, results, strict=True)
    ]


def run_responses_tool_calls(turn: Turn, response: object) -> list[dict[str, Any]]:
    """Run every function call of a Responses API response; return the output items."""
    calls = responses_tool_calls(response)
    return responses_tool_outputs(calls, _common.run_calls(turn, calls))


async def arun_responses_tool_calls(turn: Turn, response: object) -> list[dict[str, Any]]:
    """Async twin of ``run_responses_tool_calls``: the calls run concurrently with ``acall``."""
    calls = responses_tool_calls(response)
    return responses_tool_outputs(calls, await _common.arun_calls(turn, calls))

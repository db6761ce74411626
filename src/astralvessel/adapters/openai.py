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
from types import MappingProxyType as _MappingProxyType
from typing import TYPE_CHECKING, Any

from . import _common, _media

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ..executor import Turn
    from ..results import ToolResult
    from ._media import Attachment, MediaBudget

__all__ = [
    "OUTPUT_ITEMS",
    "arun_chat_tool_calls",
    "arun_responses_tool_calls",
    "chat_tool_calls",
    "chat_tool_messages",
    "responses_output",
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
        choices = _common.as_list(data["choices"], "choices") or [{}]
        choice = _common.as_dict(choices[0], "choices[0]")
        data = _common.as_dict(choice.get("message") or {}, "choices[0].message")
    calls = []
    for item in _common.as_list(data.get("tool_calls"), "tool_calls"):
        call = _common.as_dict(item, "a tool call")
        kind = call.get("type", "function")
        body = _common.as_dict(
            call.get(kind) or call.get("function") or {}, f"a tool call's {kind}"
        )
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
    (every error the library writes says what went wrong). Its tool messages
    take only text, so each outbox file is named in the text instead.
    """
    return [
        {"role": "tool", "tool_call_id": call.id, "content": _chat_text(result)}
        for call, result in zip(calls, results, strict=True)
    ]


def _chat_text(result: ToolResult) -> str:
    _, notes = _media.attachments(
        result.files,
        kinds=frozenset(),
        budget=_media.MediaBudget.text_only(),
        api="Chat Completions",
    )
    return _media.with_notes(result.text, notes)


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
        items = _common.as_list(
            _common.as_dict(response, "a Responses API response").get("output"), "output"
        )
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


def _input_image(attachment: Attachment) -> dict[str, Any]:
    return {"type": "input_image", "image_url": _media.data_url(attachment), "detail": "auto"}


def _input_file(attachment: Attachment) -> dict[str, Any]:
    return {
        "type": "input_file",
        "filename": attachment.name,
        "file_data": _media.data_url(attachment),
    }


#: The output item each kind of attachment becomes inside a ``function_call_output``.
OUTPUT_ITEMS: Mapping[str, Callable[[Attachment], dict[str, Any]]] = _MappingProxyType(
    {"image": _input_image, "pdf": _input_file}
)


def responses_output(result: ToolResult, budget: MediaBudget) -> str | list[dict[str, Any]]:
    """A result's ``function_call_output`` output: its text, or text and its outbox files.

    Images and PDFs within ``budget`` become ``input_image`` and ``input_file``
    items; every other outbox file is named in the text, with why it stayed out.
    """
    chosen, notes = _media.attachments(
        result.files, kinds=frozenset(OUTPUT_ITEMS), budget=budget, api="the Responses API"
    )
    text = _media.with_notes(result.text, notes)
    if not chosen:
        return text
    items = [{"type": "input_text", "text": text}] if text else []
    return items + [OUTPUT_ITEMS[a.kind](a) for a in chosen]


def responses_tool_outputs(
    calls: Sequence[_common.ToolCall],
    results: Sequence[ToolResult],
    *,
    budget: MediaBudget | None = None,
) -> list[dict[str, Any]]:
    """One ``function_call_output`` input item per call, answering it by ``call_id``.

    Outbox files go along as image and file items within ``budget`` (the default
    ``MediaBudget()``; ``MediaBudget.text_only()`` attaches none).
    """
    budget = budget or _media.MediaBudget()
    return [
        {
            "type": "function_call_output",
            "call_id": call.id,
            "output": responses_output(result, budget),
        }
        for call, result in zip(calls, results, strict=True)
    ]


def run_responses_tool_calls(
    turn: Turn, response: object, *, budget: MediaBudget | None = None
) -> list[dict[str, Any]]:
    """Run every function call of a Responses API response; return the output items."""
    calls = responses_tool_calls(response)
    return responses_tool_outputs(calls, _common.run_calls(turn, calls), budget=budget)


async def arun_responses_tool_calls(
    turn: Turn, response: object, *, budget: MediaBudget | None = None
) -> list[dict[str, Any]]:
    """Async twin of ``run_responses_tool_calls``: the calls run concurrently with ``acall``."""
    calls = responses_tool_calls(response)
    return responses_tool_outputs(calls, await _common.arun_calls(turn, calls), budget=budget)

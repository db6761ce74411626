"""Anthropic Messages adapter, as plain dicts.

::

    messages.append({"role": "assistant", "content": response["content"]})
    if response["stop_reason"] == "tool_use":
        messages.append(run_tool_calls(turn, response))   # one user message of tool_result blocks

The calls of one response run concurrently in the turn (``arun_tool_calls``
with ``acall`` on one task group (asyncio or trio), ``run_tool_calls`` on threads).
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
    "BLOCKS",
    "arun_tool_calls",
    "run_tool_calls",
    "tool_calls",
    "tool_result_blocks",
    "tool_result_content",
    "tool_result_message",
]


def tool_calls(message: object) -> list[_common.ToolCall]:
    """The ``tool_use`` blocks of a Messages API response (or its ``content`` list), in order."""
    if isinstance(message, abc.Sequence) and not isinstance(message, (str, bytes)):
        blocks: Sequence[Any] = message
    else:
        content = _common.as_dict(message, "a Messages API response").get("content")
        # A plain-text content (a user message's shorthand) holds no tool_use blocks.
        blocks = () if isinstance(content, str) else _common.as_list(content, "content")
    calls = []
    for raw in blocks:
        block = _common.as_dict(raw, "a content block")
        if block.get("type") == "tool_use":
            calls.append(
                _common.ToolCall(
                    id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    arguments=block.get("input"),
                )
            )
    return calls


def _image(attachment: Attachment) -> dict[str, Any]:
    source = {"type": "base64", "media_type": attachment.media_type, "data": attachment.base64}
    return {"type": "image", "source": source}


def _pdf(attachment: Attachment) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "application/pdf", "data": attachment.base64}
    return {"type": "document", "source": source, "title": attachment.name}


def _text(attachment: Attachment) -> dict[str, Any]:
    source = {"type": "text", "media_type": "text/plain", "data": attachment.data.decode()}
    return {"type": "document", "source": source, "title": attachment.name}


#: The block each kind of attachment becomes inside a ``tool_result``.
BLOCKS: Mapping[str, Callable[[Attachment], dict[str, Any]]] = _MappingProxyType(
    {"image": _image, "pdf": _pdf, "text": _text}
)


def tool_result_content(result: ToolResult, budget: MediaBudget) -> str | list[dict[str, Any]]:
    """A result's ``tool_result`` content: its text, or a text block and its outbox files.

    Images, PDFs and text files within ``budget`` become image and document
    blocks; every other outbox file is named in the text, with why it stayed out.
    """
    chosen, notes = _media.attachments(
        result.files, kinds=frozenset(BLOCKS), budget=budget, api="the Anthropic API"
    )
    text = _media.with_notes(result.text, notes)
    if not chosen:
        return text
    blocks = [{"type": "text", "text": text}] if text else []
    return blocks + [BLOCKS[a.kind](a) for a in chosen]


def tool_result_blocks(
    calls: Sequence[_common.ToolCall],
    results: Sequence[ToolResult],
    *,
    budget: MediaBudget | None = None,
) -> list[dict[str, Any]]:
    """One ``tool_result`` block per call, with ``is_error`` set on failures.

    Outbox files go along as image and document blocks within ``budget`` (the
    default ``MediaBudget()``; ``MediaBudget.text_only()`` attaches none).
    """
    budget = budget or _media.MediaBudget()
    blocks = []
    for call, result in zip(calls, results, strict=True):
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": call.id,
            "content": tool_result_content(result, budget),
        }
        if result.is_error:
            block["is_error"] = True
        blocks.append(block)
    return blocks


def tool_result_message(
    calls: Sequence[_common.ToolCall],
    results: Sequence[ToolResult],
    *,
    budget: MediaBudget | None = None,
) -> dict[str, Any]:
    """The user message that answers every call: its content is the ``tool_result`` blocks."""
    return {"role": "user", "content": tool_result_blocks(calls, results, budget=budget)}


def run_tool_calls(
    turn: Turn, message: object, *, budget: MediaBudget | None = None
) -> dict[str, Any]:
    """Run every ``tool_use`` block of a response; return the user message of results."""
    calls = tool_calls(message)
    return tool_result_message(calls, _common.run_calls(turn, calls), budget=budget)


async def arun_tool_calls(
    turn: Turn, message: object, *, budget: MediaBudget | None = None
) -> dict[str, Any]:
    """Async twin of ``run_tool_calls``: the calls run concurrently with ``acall``."""
    calls = tool_calls(message)
    return tool_result_message(calls, await _common.arun_calls(turn, calls), budget=budget)

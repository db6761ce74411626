"""Adapters between model APIs and a turn: tool calls in, tool results out, as plain dicts.

``astralvessel.adapters.openai`` covers the OpenAI Chat Completions and
Responses formats, ``astralvessel.adapters.anthropic`` the Anthropic Messages
format. None needs the vendor's SDK: they read and write the JSON shapes the
APIs document (an SDK object with ``model_dump()`` is accepted too). The calls
of one model response run concurrently in the same turn. A result's outbox
files go to the model as image and document blocks where the API takes them,
within a ``MediaBudget``; the text names every file left out.
"""

from __future__ import annotations

from ._common import ToolCall as ToolCall
from ._common import arun_calls as arun_calls
from ._common import run_calls as run_calls
from ._media import MediaBudget as MediaBudget

__all__ = ["MediaBudget", "ToolCall", "arun_calls", "run_calls"]

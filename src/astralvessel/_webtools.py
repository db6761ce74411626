"""The webfetch and websearch built-ins: glue between the executor and ``astralvessel.web``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .results import ToolResult

if TYPE_CHECKING:
    from .executor import Executor
    from .spec import ToolSpec

__all__ = ["aweb_call", "web_call"]


def web_call(executor: Executor, spec: ToolSpec, args: Mapping[str, Any]) -> ToolResult:
    """Run webfetch or websearch."""
    return ToolResult.error(f"Error: {spec.name} cannot run here yet.", tool=spec.name)


async def aweb_call(executor: Executor, spec: ToolSpec, args: Mapping[str, Any]) -> ToolResult:
    """Async twin of ``web_call``."""
    return web_call(executor, spec, args)

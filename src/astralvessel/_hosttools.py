"""Tools that run in the host process: service tools and Python tools."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .results import ToolResult

if TYPE_CHECKING:
    from .executor import Executor
    from .spec import ToolSpec

__all__ = ["ahost_call", "host_call"]


def host_call(executor: Executor, spec: ToolSpec, args: dict[str, Any], *, timeout: float) -> ToolResult:
    """Run a service or Python tool."""
    return ToolResult.error(f"Error: {spec.name} cannot run here yet.", tool=spec.name)


async def ahost_call(
    executor: Executor, spec: ToolSpec, args: dict[str, Any], *, timeout: float
) -> ToolResult:
    """Async twin of ``host_call``."""
    return host_call(executor, spec, args, timeout=timeout)

"""The runners for tools that call Python in the host: Python tools and bound services.

A Python tool is a function registered with ``Registry.tool``; its ``ToolSpec``
carries it as ``handler``. A host may also bind a Python callable to a service
name (``Executor(services={...})``), which then answers that service's tools
in-process instead of an HTTP post (``_services``). Both run with the host's
full rights: no sandbox stands between them and the machine.

``ToolError`` raised by a tool or callable is a failure the model reads; a
call past its timeout ends with ``[timed out after N s]``; any other exception
is the host's and propagates. The text follows ``results.render_host_value``.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import attrs

from .._calls._plans import Call, Plan, TurnContext
from .._ground._aio import to_thread
from ..errors import ConfigError, ToolError
from ..results import ToolResult, render_host_value, render_timeout, render_tool_error
from ._services import plan_post

if TYPE_CHECKING:
    from ..sandbox._base import SandboxSession
    from ..spec import ToolSpec

__all__ = ["plan_python", "plan_service"]

_T = TypeVar("_T")


def plan_python(context: TurnContext, spec: ToolSpec, call: Call) -> Plan[Any] | ToolResult:
    """Call the function the spec carries, with the arguments structured into its types."""
    handler = spec.handler
    if handler is None:
        raise ConfigError(
            [f"Python tool {spec.name!r} has no function; register it with @registry.tool"]
        )
    try:
        args, kwargs = handler.structure(call.arguments)
    except ValueError as exc:
        return ToolResult.error(
            f"Error: invalid arguments for {spec.name}: {exc}. "
            f"Call {spec.name} again with arguments that match its parameters schema."
        )
    return HostFunction(
        func=handler.func, args=args, kwargs=kwargs, call=call, output_chars=context.output_chars
    )


def plan_service(context: TurnContext, spec: ToolSpec, call: Call) -> Plan[Any] | ToolResult:
    """A callable bound to the tool's service, or else one HTTP post to the service's URL."""
    bound = context.services.get(spec.service or "")
    if bound is None:
        return plan_post(context, spec, call)
    if not callable(bound):
        raise ConfigError(
            [f"services[{spec.service!r}] must be a callable, not {type(bound).__name__}"]
        )
    return HostFunction(
        func=bound,
        args=[call.tool, dict(call.arguments)],
        kwargs={},
        call=call,
        output_chars=context.output_chars,
    )


@attrs.frozen(kw_only=True)
class HostFunction:
    """A Python function called in the host with the call's arguments, under its timeout."""

    func: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]
    call: Call
    output_chars: int
    sandboxed: bool = attrs.field(default=False, init=False)

    def run(self, session: SandboxSession | None) -> Any:
        return _run_sync(self.func, self.args, self.kwargs, self.call.timeout)

    async def arun(self, session: SandboxSession | None) -> Any:
        return await _run_async(self.func, self.args, self.kwargs, self.call.timeout)

    def finish(self, outcome: Any) -> ToolResult:
        return render_host_value(outcome, tool=self.call.tool, cap=self.output_chars)

    def rescue(self, exc: Exception) -> ToolResult | None:
        if isinstance(exc, ToolError):
            return render_tool_error(str(exc) or type(exc).__name__, cap=self.output_chars)
        if isinstance(exc, _Timeout):
            return render_timeout("", timeout=self.call.timeout)
        return None


class _Timeout(Exception):  # control flow inside this module only
    """The call ran past its timeout (distinct from a TimeoutError the tool itself raises)."""


def _run_sync(
    func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], timeout: float
) -> Any:
    """Call ``func`` here; a coroutine function runs on its own loop in a worker thread."""
    if not inspect.iscoroutinefunction(func):
        value = func(*args, **kwargs)
        if not inspect.isawaitable(value):
            return value
        awaitable: Awaitable[Any] = value
    else:
        awaitable = func(*args, **kwargs)
    # The caller may already be inside an event loop, so the coroutine gets a fresh (asyncio)
    # loop of its own in a worker thread; the timeout cancels it there.
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["value"] = anyio.run(_with_timeout, awaitable, timeout)
        except BaseException as exc:  # handed back to the calling thread
            box["error"] = exc

    thread = threading.Thread(target=runner, name="astralvessel-async-tool", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


async def _with_timeout(awaitable: Awaitable[_T], timeout: float) -> _T:
    """Await under ``timeout``; past it ``_Timeout``. The tool's own ``TimeoutError`` passes."""
    with anyio.move_on_after(timeout) as scope:
        return await awaitable
    if scope.cancelled_caught:
        raise _Timeout
    raise AssertionError("unreachable: the scope returned or was cancelled")  # pragma: no cover


async def _run_async(
    func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], timeout: float
) -> Any:
    if inspect.iscoroutinefunction(func):
        return await _with_timeout(func(*args, **kwargs), timeout)
    # A sync function must not block the event loop; Python cannot stop a thread, so
    # its timeout is its own business (see the Python tools docs).
    # A cancelled call leaves the thread to finish alone, as a timed-out one does.
    value = await to_thread(functools.partial(func, *args, **kwargs), abandon=True)
    if inspect.isawaitable(value):
        return await _with_timeout(value, timeout)
    return value

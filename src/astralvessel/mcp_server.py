"""Serve an executor's tools over the Model Context Protocol (needs the ``mcp`` extra).

One MCP session is one turn: the session's calls share one sandbox and one
workspace, which end when the client disconnects. Tools are listed with the
registry's ``"mcp"`` schemas (titles and read-only hints for the built-ins,
and an ``outputSchema`` for a Python tool whose return annotation is an
object), limited to the executor's granted scopes; each result is one text
content block (and ``structuredContent`` when the text is one JSON object,
checked against the tool's ``outputSchema`` if it has one) with ``isError``
set as the turn decided, so a
refusal, a failing command or a timeout reaches the client's model as an error
result it can act on. The host's own failures (a sandbox that cannot start)
are protocol errors.

From the command line: ``astralvessel mcp AGENT_DIR [--backend NAME] [--mount ...]``.
From Python::

    executor = Executor(registry, sandbox="bubblewrap", mounts={"/data": "data"})
    asyncio.run(serve_stdio(executor))
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import anyio
from jsonschema.exceptions import best_match as _best_match
from jsonschema.validators import validator_for as _validator_for

from . import __version__
from ._ground._aio import to_thread as _to_thread
from ._ground._suggest import install_extra as _install_extra

try:
    import mcp.server.lowlevel as mcp_lowlevel
    import mcp.server.stdio as mcp_stdio
    import mcp.types as mcp_types
    from mcp.shared.message import SessionMessage as _SessionMessage
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "serving tools over MCP needs the mcp package (2.3 or newer): " + _install_extra("mcp")
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Mapping

    from jsonschema.protocols import Validator
    from mcp.server.context import ServerRequestContext

    from .executor import Executor, Turn
    from .results import ToolResult

__all__ = [
    "PROGRESS_INTERVAL",
    "create_server",
    "serve_stdio",
    "structured_content",
    "to_mcp_result",
]


#: Seconds between two progress notifications while a call runs.
PROGRESS_INTERVAL = 1.0


def structured_content(result: ToolResult) -> dict[str, Any] | None:
    """The JSON object a successful result's whole text is, or None when it is not one."""
    text = result.text.strip()
    if result.is_error or not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def to_mcp_result(
    result: ToolResult, *, output_schema: Mapping[str, Any] | None = None
) -> mcp_types.CallToolResult:
    """One ``ToolResult`` as an MCP ``CallToolResult``: its text, and ``isError``.

    A successful result whose text is one JSON object also carries it as
    ``structuredContent``; the text block stays for clients that read only text.
    When the tool lists an ``output_schema``, a successful result must be an
    object that fits it (MCP clients refuse anything else): one that does not,
    such as output cut at the output cap, becomes an error result saying why.
    """
    structured = structured_content(result)
    if output_schema is not None and not result.is_error:
        problem = _unfit(structured, output_schema, cut=result.dropped_chars > 0)
        if problem is not None:
            note = f"[this is not the JSON object the tool's output schema describes: {problem}]"
            return mcp_types.CallToolResult.model_validate(
                {"content": [{"type": "text", "text": f"{result.text}\n{note}"}], "isError": True}
            )
    answer: dict[str, Any] = {
        "content": [{"type": "text", "text": result.text}],
        "isError": result.is_error,
    }
    if structured is not None:
        answer["structuredContent"] = structured
    return mcp_types.CallToolResult.model_validate(answer)


def _unfit(
    structured: dict[str, Any] | None, schema: Mapping[str, Any], *, cut: bool
) -> str | None:
    """Why ``structured`` does not fit ``schema``, checked as MCP clients check it; or None."""
    if structured is None:
        return "it was cut at the output cap" if cut else "it is not one JSON object"
    validator = _validator(json.dumps(schema, sort_keys=True))
    error = _best_match(validator.iter_errors(structured))
    return None if error is None else error.message


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Validator:
    # Compiling is the cost, not validating: once per distinct schema.
    schema = json.loads(schema_text)
    return _validator_for(schema)(schema)


async def _report_progress(
    ctx: ServerRequestContext[Any], tool: str, timeout: float | None, interval: float
) -> None:
    """Tell the client the call is still running, once at once and then every ``interval`` s.

    Progress counts the seconds the call has run, out of its timeout. It is a
    no-op when the client sent no progress token.
    """
    started = anyio.current_time()
    while True:
        elapsed = anyio.current_time() - started
        try:
            await ctx.session.report_progress(
                elapsed, timeout, f"{tool}: running for {elapsed:.0f} s in the sandbox"
            )
        except Exception:  # progress is best effort: the call's own answer is what counts
            return
        await anyio.sleep(interval)


def create_server(
    turn: Turn, *, name: str | None = None, progress_interval: float = PROGRESS_INTERVAL
) -> mcp_lowlevel.Server[Any]:
    """A low-level MCP server whose tools are ``turn``'s executor's tools, called in ``turn``.

    Tools are listed with titles and behaviour hints where known (the file tools
    are read-only). While a call runs, a client that sent a progress token gets a
    progress notification at once and then every ``progress_interval`` seconds.
    """
    executor = turn.executor
    agent = executor.registry.agent
    server_name = name or (agent.name if agent is not None else "astralvessel")

    schemas = executor.registry.schemas("mcp", scopes=executor.scopes)
    #: What each tool promises to return, as listed: its results are held to it.
    output_schemas = {tool["name"]: tool.get("outputSchema") for tool in schemas}

    async def list_tools(
        ctx: ServerRequestContext[Any], params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult.model_validate({"tools": schemas})

    async def call_tool(
        ctx: ServerRequestContext[Any], params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        spec = executor.registry.get(params.name)
        timeout = (spec.timeout_seconds or executor.timeout_seconds) if spec else None
        async with anyio.create_task_group() as group:
            group.start_soon(_report_progress, ctx, params.name, timeout, progress_interval)
            # The turn checks the name, the scopes and the arguments; its refusals are results.
            result = await turn.acall(params.name, params.arguments or {})
            group.cancel_scope.cancel()
        return to_mcp_result(result, output_schema=output_schemas.get(params.name))

    return mcp_lowlevel.Server(
        server_name,
        version=__version__,
        instructions=(
            f"Tools of the {server_name} agent. Each call runs in a sandbox; "
            "a result marked as an error says what went wrong and what to try."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(
    executor: Executor, *, name: str | None = None, start_sandbox: bool = False
) -> None:
    """Serve ``executor``'s tools on stdin and stdout until the client disconnects.

    The whole session is one turn. ``start_sandbox`` starts the turn's sandbox
    before serving, so a backend that cannot run here raises at once instead
    of failing the first call.
    """
    async with executor.turn() as turn:
        if start_sandbox:
            await _start(turn)
        server = create_server(turn, name=name)
        try:
            async with (
                mcp_stdio.stdio_server() as (read_stream, write_stream),
                anyio.create_task_group() as group,
            ):
                send, readable = anyio.create_memory_object_stream[_SessionMessage | Exception](0)
                # Closed here, not left to the collector: an unclosed stream warns when it is
                # collected, in whatever code runs then (a later test, as an error there).
                async with readable:
                    group.start_soon(_answer_unreadable, read_stream, send, write_stream)
                    await server.run(readable, write_stream, server.create_initialization_options())
        except BaseException as exc:
            if not _client_gone(exc):
                raise
            # The client went away mid-session: end quietly. Nothing more can reach it,
            # and the interpreter's own flush of stdout at exit must not complain either.
            _silence_stdout()


async def _answer_unreadable(source: Any, sink: Any, write_stream: Any) -> None:
    """Pass the client's messages on to the server, answering each call the SDK could not
    read (a message nested past its JSON parser's 200 levels): the SDK drops those without
    an answer, and the client would wait for one forever."""
    async with sink:
        async for item in source:
            answer = _unreadable_answer(item) if isinstance(item, Exception) else None
            if answer is None:
                await sink.send(item)
            else:
                await write_stream.send(_SessionMessage(answer))


def _unreadable_answer(error: Exception) -> mcp_types.JSONRPCResponse | None:
    """An error result for a ``tools/call`` the SDK could not parse, if its id can be read."""
    errors = getattr(error, "errors", None)
    try:
        first = errors()[0] if callable(errors) else {}
        request = json.loads(first.get("input") or "")
    except (ValueError, RecursionError, IndexError, TypeError, AttributeError):
        return None  # nested past even the standard library's reach: nothing names the call
    if not isinstance(request, dict) or request.get("method") != "tools/call":
        return None
    call_id, params = request.get("id"), request.get("params")
    if isinstance(call_id, bool) or not isinstance(call_id, (int, str)):
        return None
    name = str(params.get("name")) if isinstance(params, dict) else "the tool"
    text = (
        f"Error: the arguments for {name} could not be read ({first.get('msg', 'invalid')}). "
        f"Call {name} again with flatter arguments."
    )
    result = mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=text)], is_error=True
    )
    return mcp_types.JSONRPCResponse(
        jsonrpc="2.0", id=call_id, result=result.model_dump(by_alias=True, exclude_none=True)
    )


#: What the stdio transport raises when the client has closed its end of the pipes.
_DISCONNECTS: tuple[type[BaseException], ...] = (
    BrokenPipeError,
    ConnectionResetError,
    EOFError,
)


def _client_gone(exc: BaseException) -> bool:
    """Whether ``exc`` (or every exception in its group) only says the client went away."""
    import anyio

    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, (list, tuple)) and inner:
        return all(_client_gone(e) for e in inner)
    return isinstance(exc, (*_DISCONNECTS, anyio.BrokenResourceError, anyio.ClosedResourceError))


def _silence_stdout() -> None:
    import contextlib
    import os
    import sys

    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


async def _start(turn: Turn) -> None:
    await _to_thread(lambda: turn.session)

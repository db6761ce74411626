"""Tools that run in the host process: service tools and Python tools.

A service tool (``service = "NAME"`` in its tool file) is one HTTP POST of
``{"tool": ..., "arguments": {...}}`` to ``[services.NAME] url``, sent through a
web `Transport` with the tool's timeout. Service URLs are the operator's own, so
the public-address egress rule does not apply to them; redirects are never
followed, and at most ``MAX_BODY_BYTES`` of a response are read. A host may bind
a Python callable to a service name instead (``Executor(services={...})``).

A Python tool is a function registered with ``Registry.tool``. Both kinds run
with the host's full rights: no sandbox stands between them and the machine.

What the model sees follows the command rules where they apply: the text is
cut to ``tool_output_chars`` with a note, a call past its timeout ends with
``[timed out after N s]``, and a failure is an error result. ``ToolError``
raised by a tool or callable is a failure the model reads; any other exception
is the host's and propagates.
"""

from __future__ import annotations

import asyncio
import codecs
import inspect
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import attrs

from ._pytools import PythonTool, ToolError, _converter
from .errors import ConfigError
from .results import ToolResult, timeout_note, truncation_note
from .spec import ToolKind
from .web._stdlib import StdlibTransport
from .web._transport import HttpRequest

if TYPE_CHECKING:
    from .executor import Executor
    from .spec import ToolSpec

__all__ = ["MAX_BODY_BYTES", "ahost_call", "host_call"]

#: The most of one service response the host reads; the rest is not fetched.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: How much of a failed response's body the error text quotes.
ERROR_BODY_CHARS = 500
NO_OUTPUT = "[no output]"
EMPTY_RESPONSE = "[empty response]"

_T = TypeVar("_T")
_default_transport: StdlibTransport | None = None


# -- entry points ---------------------------------------------------------------------------


def host_call(
    executor: Executor, spec: ToolSpec, args: dict[str, Any], *, timeout: float
) -> ToolResult:
    """Run a service or Python tool in the calling thread."""
    if spec.kind is ToolKind.PYTHON:
        tool = _python_tool(executor, spec)
        try:
            call_args, call_kwargs = tool.structure(args)
        except ValueError as exc:
            return _invalid(spec, exc)
        return _guard(
            executor, spec, timeout, lambda: _run_sync(tool.func, call_args, call_kwargs, timeout)
        )
    bound = _bound_service(executor, spec)
    if bound is not None:
        return _guard(
            executor, spec, timeout, lambda: _run_sync(bound, [spec.name, args], {}, timeout)
        )
    return _post(executor, spec, args, timeout)


async def ahost_call(
    executor: Executor, spec: ToolSpec, args: dict[str, Any], *, timeout: float
) -> ToolResult:
    """Async twin of ``host_call``: sync functions run in a worker thread."""
    if spec.kind is ToolKind.PYTHON:
        tool = _python_tool(executor, spec)
        try:
            call_args, call_kwargs = tool.structure(args)
        except ValueError as exc:
            return _invalid(spec, exc)
        return await _aguard(
            executor, spec, timeout, _run_async(tool.func, call_args, call_kwargs, timeout)
        )
    bound = _bound_service(executor, spec)
    if bound is not None:
        return await _aguard(
            executor, spec, timeout, _run_async(bound, [spec.name, args], {}, timeout)
        )
    transport = _transport(executor)
    if not hasattr(transport, "asend"):
        return await asyncio.to_thread(_post, executor, spec, args, timeout)
    return await _apost(executor, spec, args, timeout, transport)


# -- Python tools and bound callables -------------------------------------------------------


def _python_tool(executor: Executor, spec: ToolSpec) -> PythonTool:
    tool = executor.registry._callables.get(spec.name)
    if not isinstance(tool, PythonTool):
        raise ConfigError(
            [f"Python tool {spec.name!r} has no function; register it with @registry.tool"]
        )
    return tool


def _bound_service(executor: Executor, spec: ToolSpec) -> Callable[..., Any] | None:
    bound = executor.services.get(spec.service or "")
    if bound is not None and not callable(bound):
        raise ConfigError(
            [f"services[{spec.service!r}] must be a callable, not {type(bound).__name__}"]
        )
    return bound


class _Timeout(Exception):  # control flow inside this module only
    """The call ran past its timeout (distinct from a TimeoutError the tool itself raises)."""


class _Raised(Exception):  # carries a tool's own exception out of wait_for
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


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
    # The caller may already be inside an event loop, so the coroutine gets a fresh loop of
    # its own in a worker thread; the timeout cancels it there.
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["value"] = asyncio.run(_with_timeout(awaitable, timeout))
        except BaseException as exc:  # handed back to the calling thread
            box["error"] = exc

    thread = threading.Thread(target=runner, name="astralvessel-async-tool", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


async def _with_timeout(awaitable: Awaitable[_T], timeout: float) -> _T:
    async def inner() -> _T:
        try:
            return await awaitable
        except asyncio.TimeoutError as exc:
            raise _Raised(exc) from exc

    try:
        return await asyncio.wait_for(inner(), timeout)
    except asyncio.TimeoutError:
        raise _Timeout from None
    except _Raised as raised:
        raise raised.exc from None


async def _run_async(
    func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any], timeout: float
) -> Any:
    if inspect.iscoroutinefunction(func):
        return await _with_timeout(func(*args, **kwargs), timeout)
    # A sync function must not block the event loop; Python cannot stop a thread, so
    # its timeout is its own business (see the Python tools docs).
    value = await asyncio.to_thread(func, *args, **kwargs)
    if inspect.isawaitable(value):
        return await _with_timeout(value, timeout)
    return value


def _guard(
    executor: Executor, spec: ToolSpec, timeout: float, run: Callable[[], Any]
) -> ToolResult:
    try:
        value = run()
    except ToolError as exc:
        return _capped(executor, spec, str(exc) or type(exc).__name__, is_error=True)
    except _Timeout:
        return _timed_out(spec, "", timeout)
    return _value_result(executor, spec, value)


async def _aguard(
    executor: Executor, spec: ToolSpec, timeout: float, run: Awaitable[Any]
) -> ToolResult:
    try:
        value = await run
    except ToolError as exc:
        return _capped(executor, spec, str(exc) or type(exc).__name__, is_error=True)
    except _Timeout:
        return _timed_out(spec, "", timeout)
    return _value_result(executor, spec, value)


def _invalid(spec: ToolSpec, exc: ValueError) -> ToolResult:
    return ToolResult.error(
        f"Error: invalid arguments for {spec.name}: {exc}. "
        f"Call {spec.name} again with arguments that match its parameters schema.",
        tool=spec.name,
    )


def _value_result(executor: Executor, spec: ToolSpec, value: object) -> ToolResult:
    """What a tool returned, as the model sees it: text as is, anything else as JSON."""
    if isinstance(value, ToolResult):
        return attrs.evolve(value, tool=spec.name)
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", "replace")
    else:
        try:
            text = json.dumps(_converter.unstructure(value), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"tool {spec.name!r} returned a {type(value).__name__}, which cannot be shown "
                f"to the model ({exc}); return str, a JSON-ready value, or an attrs instance"
            ) from None
    return _capped(executor, spec, text or NO_OUTPUT, is_error=False)


def _capped(executor: Executor, spec: ToolSpec, text: str, *, is_error: bool) -> ToolResult:
    cap = executor.output_chars
    dropped = max(0, len(text) - cap)
    if dropped:
        text = f"{text[:cap].removesuffix(chr(10))}\n{truncation_note(dropped)}"
    return ToolResult(text=text, is_error=is_error, dropped_chars=dropped, tool=spec.name)


def _timed_out(spec: ToolSpec, output: str, timeout: float, dropped: int = 0) -> ToolResult:
    notes = [truncation_note(dropped)] if dropped else []
    notes.append(timeout_note(timeout))
    text = "\n".join([output.removesuffix("\n"), *notes] if output else notes)
    return ToolResult(
        text=text, is_error=True, timed_out=True, dropped_chars=dropped, tool=spec.name
    )


# -- service posts --------------------------------------------------------------------------


def _transport(executor: Executor) -> Any:
    global _default_transport  # noqa: PLW0603 - one shared, stateless default
    chosen = getattr(executor, "service_transport", None)
    if chosen is not None:
        return chosen
    if _default_transport is None:
        _default_transport = StdlibTransport()
    return _default_transport


@attrs.frozen(kw_only=True)
class _Target:
    service: str
    scheme: str
    host: str
    port: int
    path: str


def _target(executor: Executor, spec: ToolSpec) -> _Target:
    name = spec.service or ""
    agent = executor.registry.agent
    service = agent.services.get(name) if agent is not None else None
    if service is None:
        raise ConfigError(
            [
                f"service tool {spec.name!r} posts to service {name!r}, which has no "
                f"[services.{name}] url in vessel.toml; add one, or bind a callable with "
                f"Executor(services={{{name!r}: function}})"
            ]
        )
    parts = urlsplit(service.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            [f"services.{name}.url: {service.url!r} must be an http:// or https:// URL"]
        )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(
        service=name,
        scheme=parts.scheme,
        host=parts.hostname,
        port=parts.port or (443 if parts.scheme == "https" else 80),
        path=path,
    )


def _request(
    target: _Target, address: str, spec: ToolSpec, args: Mapping[str, Any], deadline: float
) -> HttpRequest:
    body = json.dumps({"tool": spec.name, "arguments": dict(args)}, ensure_ascii=False)
    return HttpRequest(
        method="POST",
        scheme=target.scheme,
        host=target.host,
        address=address,
        port=target.port,
        target=target.path,
        headers=(
            ("Content-Type", "application/json"),
            ("Accept", "text/plain, application/json, */*"),
            # The transport hands back the raw body; ask for it unencoded.
            ("Accept-Encoding", "identity"),
            ("User-Agent", "astralvessel"),
        ),
        body=body.encode("utf-8"),
        deadline=deadline,
    )


def _pick_address(infos: Iterable[tuple[Any, ...]]) -> str:
    for info in infos:
        return str(info[4][0])
    raise OSError("the name resolved to no address")


class _Body:
    """A response body decoded as it streams in: at most ``keep`` characters kept, the rest counted.

    An error response only needs a short quote, so its reading stops once that is kept.
    """

    def __init__(self, executor: Executor, status: int, reason: str) -> None:
        self.status = status
        self.reason = reason
        self.ok = 200 <= status < 300
        self.keep = executor.output_chars if self.ok else ERROR_BODY_CHARS
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0
        self.read = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes, *, final: bool = False) -> bool:
        """Take one chunk; return False when reading should stop."""
        self.read += len(data)
        piece = self._decoder.decode(data, final=final)
        room = max(0, self.keep - self.kept)
        if room:
            self.parts.append(piece[:room])
            self.kept += min(room, len(piece))
        self.dropped += max(0, len(piece) - room)
        return self.read < MAX_BODY_BYTES and (self.ok or self.kept < self.keep)

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _outcome(executor: Executor, spec: ToolSpec, target: _Target, body: _Body) -> ToolResult:
    status = body.status
    metadata = {"http_status": str(status)}
    if body.ok:
        text = body.text
        if not text:
            return ToolResult(text=EMPTY_RESPONSE, tool=spec.name, metadata=metadata)
        if body.dropped:
            text = f"{text.removesuffix(chr(10))}\n{truncation_note(body.dropped)}"
        return ToolResult(text=text, dropped_chars=body.dropped, tool=spec.name, metadata=metadata)
    quoted = " ".join(body.text.split())
    if body.dropped:
        quoted += " ..."
    redirect = " (redirects are not followed)" if 300 <= status < 400 else ""
    text = (
        f"Error: the {target.service} service answered HTTP {status} {body.reason}".rstrip()
        + redirect
        + (f": {quoted}" if quoted else "")
    )
    return attrs.evolve(_capped(executor, spec, text, is_error=True), metadata=metadata)


def _unreachable(spec: ToolSpec, target: _Target, exc: BaseException) -> ToolResult:
    detail = str(exc) or type(exc).__name__
    return ToolResult.error(
        f"Error: the {target.service} service could not be reached ({detail}). "
        "This is not a problem with your arguments; you may try again later.",
        tool=spec.name,
    )


def _post(
    executor: Executor, spec: ToolSpec, args: Mapping[str, Any], timeout: float
) -> ToolResult:
    target = _target(executor, spec)
    deadline = time.monotonic() + timeout
    transport = _transport(executor)
    body: _Body | None = None
    try:
        address = _pick_address(
            socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        )
        response = transport.send(_request(target, address, spec, args, deadline))
        try:
            body = _Body(executor, response.status, response.reason)
            for chunk in response.chunks:
                if not body.feed(chunk):
                    break
            else:
                body.feed(b"", final=True)
        finally:
            response.close()
    except TimeoutError:
        return _timed_out(spec, body.text if body else "", timeout, body.dropped if body else 0)
    except OSError as exc:
        return _unreachable(spec, target, exc)
    return _outcome(executor, spec, target, body)


async def _apost(
    executor: Executor, spec: ToolSpec, args: Mapping[str, Any], timeout: float, transport: Any
) -> ToolResult:
    target = _target(executor, spec)
    deadline = time.monotonic() + timeout
    body: _Body | None = None
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM), timeout
        )
        response = await transport.asend(
            _request(target, _pick_address(infos), spec, args, deadline)
        )
        try:
            body = _Body(executor, response.status, response.reason)
            chunks: AsyncIterator[bytes] = response.chunks
            finished = True
            async for chunk in chunks:
                if not body.feed(chunk):
                    finished = False
                    break
            if finished:
                body.feed(b"", final=True)
        finally:
            await response.aclose()
    except (TimeoutError, asyncio.TimeoutError):
        return _timed_out(spec, body.text if body else "", timeout, body.dropped if body else 0)
    except OSError as exc:
        return _unreachable(spec, target, exc)
    return _outcome(executor, spec, target, body)

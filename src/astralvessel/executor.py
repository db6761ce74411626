"""Executor and Turn: run a model's tool calls, one sandbox per turn.

The executor owns policy (which tools, which scopes, which mounts and limits);
a turn owns one running sandbox and its workspace. Every model mistake becomes a
``ToolResult`` with ``is_error``; only the host's mistakes raise.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

from ._arguments import Refusal, args_argv, check_arguments, parse_arguments, unknown_tool
from .results import ToolResult, render_output
from .sandbox._base import RunOutcome, RunRequest, Sandbox, SandboxSession
from .sandbox._policy import AGENT_DIR, WORKSPACE_DIR, Limits, Mount, Policy, Promise
from .spec import ALL_SCOPES, InputMode, Scope, ToolKind, ToolSpec

if TYPE_CHECKING:
    from .registry import Registry

__all__ = ["Executor", "Turn"]

MountsArg = Mapping[str, "str | Path"] | Iterable[Mount]


class Executor:
    """Binds a registry to a sandbox backend, mounts, granted scopes and limits.

    ``sandbox`` is a backend instance, a backend name (``"bubblewrap"``...), or
    None for the best confined backend that can run here. ``mounts`` maps sandbox
    paths to host folders, read-only (a host path ending in ``:rw`` is writable), or
    lists ``Mount`` values. ``scopes``
    defaults to the agent's ``scopes``, or all four when it names none.
    ``relax`` names confinement promises the host explicitly gives up.
    ``fetcher`` and ``searcher`` serve webfetch and websearch; ``services`` binds
    Python callables to ``[services]`` names, and ``service_transport`` carries
    service tools' HTTP posts.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        sandbox: Sandbox | str | None = None,
        mounts: MountsArg | None = None,
        scopes: Iterable[Scope | str] | None = None,
        limits: Limits | None = None,
        relax: Iterable[Promise | str] = (),
        timeout_seconds: float | None = None,
        output_chars: int | None = None,
        fetcher: Any | None = None,
        searcher: Any | None = None,
        services: Mapping[str, Callable[..., Any]] | None = None,
        service_transport: Any | None = None,
    ) -> None:
        agent = registry.agent
        self.registry = registry
        self.sandbox = _resolve_backend(sandbox)
        self.scopes: frozenset[Scope] = (
            frozenset(Scope.parse(str(s)) for s in scopes)
            if scopes is not None
            else (agent.scopes if agent is not None and agent.scopes is not None else ALL_SCOPES)
        )
        self.timeout_seconds = timeout_seconds or (agent.tool_timeout_seconds if agent else 30.0)
        self.output_chars = output_chars or (agent.tool_output_chars if agent else 30_000)
        self.policy = Policy(
            agent_dir=agent.path if agent is not None else None,
            workdir=agent.workdir if agent is not None else WORKSPACE_DIR,
            mounts=_mounts(mounts),
            limits=limits or (agent.limits if agent is not None else Limits()),
        ).relax(*relax)
        self.fetcher = fetcher
        self.searcher = searcher
        self.services = dict(services or {})
        #: The web Transport service tools post through (the stdlib one when None).
        self.service_transport = service_transport

    def turn(self) -> Turn:
        """Open one turn: a context manager (``with`` or ``async with``) owning one sandbox."""
        return Turn(self)

    def allowed(self, name: str) -> bool:
        """Whether the model may call ``name``: registered and within the granted scopes."""
        spec = self.registry.get(name)
        return spec is not None and spec.scope in self.scopes

    def tool_names(self) -> list[str]:
        """The tools the model may call under the granted scopes."""
        return self.registry.names(self.scopes)

    def __repr__(self) -> str:
        return f"Executor({self.registry!r}, sandbox={self.sandbox!r})"


class Turn:
    """One turn: one sandbox, one workspace, any number of (concurrent) calls.

    The sandbox starts on the first call that needs it and ends with the turn.
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._session: SandboxSession | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Turn:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def close(self) -> None:
        """End the turn: kill everything in its sandbox and remove its workspace."""
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None:
            session.close()

    async def aclose(self) -> None:
        """Async twin of ``close``."""
        await asyncio.to_thread(self.close)

    @property
    def session(self) -> SandboxSession:
        """The turn's running sandbox, started now if it has not been yet."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this turn has ended; open a new one with executor.turn()")
            if self._session is None:
                self._session = self.executor.sandbox.start(self.executor.policy)
            return self._session

    # -- calls ----------------------------------------------------------------------------

    def call(self, name: str, arguments: object = None) -> ToolResult:
        """Run one tool call; ``arguments`` is a dict or the model's raw JSON text."""
        started = time.monotonic()
        prepared = self._prepare(name, arguments)
        if isinstance(prepared, ToolResult):
            return prepared
        spec, args = prepared
        result = self._dispatch_sync(spec, args)
        return _finish(result, spec, started)

    async def acall(self, name: str, arguments: object = None) -> ToolResult:
        """Async twin of ``call``; calls of one turn may run concurrently."""
        started = time.monotonic()
        prepared = self._prepare(name, arguments)
        if isinstance(prepared, ToolResult):
            return prepared
        spec, args = prepared
        result = await self._dispatch_async(spec, args)
        return _finish(result, spec, started)

    def _prepare(
        self, name: str, arguments: object
    ) -> tuple[ToolSpec, dict[str, Any]] | ToolResult:
        executor = self.executor
        if not isinstance(name, str) or not executor.allowed(name):
            return ToolResult.error(unknown_tool(name, executor.tool_names()), tool=str(name))
        spec = executor.registry[name]
        try:
            args = parse_arguments(name, arguments)
            check_arguments(spec, args)
        except Refusal as refusal:
            return ToolResult.error(str(refusal), tool=name)
        return spec, args

    # -- dispatch ---------------------------------------------------------------------------

    def _dispatch_sync(self, spec: ToolSpec, args: dict[str, Any]) -> ToolResult:
        if spec.kind is ToolKind.COMMAND:
            request = self._command_request(spec, args)
            return self._run_result(spec, request, self.session.run(request))
        if spec.kind is ToolKind.BUILTIN:
            return self._builtin_sync(spec, args)
        return self._host_tool_sync(spec, args)

    async def _dispatch_async(self, spec: ToolSpec, args: dict[str, Any]) -> ToolResult:
        if spec.kind is ToolKind.COMMAND:
            request = self._command_request(spec, args)
            session = await self._asession()
            return self._run_result(spec, request, await session.arun(request))
        if spec.kind is ToolKind.BUILTIN:
            return await self._builtin_async(spec, args)
        return await self._host_tool_async(spec, args)

    async def _asession(self) -> SandboxSession:
        with self._lock:
            if self._session is not None:
                return self._session
        return await asyncio.to_thread(lambda: self.session)

    def _timeout(self, spec: ToolSpec) -> float:
        return spec.timeout_seconds or self.executor.timeout_seconds

    def _command_request(self, spec: ToolSpec, args: Mapping[str, Any]) -> RunRequest:
        argv = [part.replace("{package}", str(AGENT_DIR)) for part in spec.command or ()]
        if spec.input is InputMode.ARGS:
            argv += args_argv(spec, args)
            stdin = b""
        else:
            stdin = _json_bytes(args)
        return RunRequest(
            argv=tuple(argv),
            stdin=stdin,
            timeout=self._timeout(spec),
            output_chars=self.executor.output_chars,
        )

    def _run_result(
        self,
        spec: ToolSpec,
        request: RunRequest,
        outcome: RunOutcome,
        *,
        show_exit_code: bool = False,
    ) -> ToolResult:
        text = render_output(
            outcome.output,
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            dropped_chars=outcome.dropped_chars,
            timeout=request.timeout,
            show_exit_code=show_exit_code,
        )
        return ToolResult(
            text=text,
            is_error=outcome.timed_out or outcome.exit_code != 0,
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            dropped_chars=outcome.dropped_chars,
            files=outcome.files,
            duration=outcome.duration,
            tool=spec.name,
            backend=self.executor.sandbox.name,
            policy_id=self.executor.policy.identity,
            metadata=dict(outcome.metadata),
        )

    # built-ins: read/glob/list are served by the sandbox server; grep and bash are
    # confined calls; webfetch and websearch run here, in the host, through the web policy.

    def _builtin_sync(self, spec: ToolSpec, args: dict[str, Any]) -> ToolResult:
        from . import builtins

        kind = builtins.BUILTINS[spec.name].kind
        if kind == "server":
            outcome = self.session.file_tool(spec.name, args, timeout=self._timeout(spec))
            return self._file_result(spec, outcome.text, outcome.is_error)
        if kind == "confined":
            request = self._builtin_request(spec, args)
            return self._builtin_run_result(spec, request, self.session.run(request))
        return self._web_sync(spec, args)

    async def _builtin_async(self, spec: ToolSpec, args: dict[str, Any]) -> ToolResult:
        from . import builtins

        kind = builtins.BUILTINS[spec.name].kind
        if kind == "server":
            session = await self._asession()
            outcome = await session.afile_tool(spec.name, args, timeout=self._timeout(spec))
            return self._file_result(spec, outcome.text, outcome.is_error)
        if kind == "confined":
            request = self._builtin_request(spec, args)
            session = await self._asession()
            return self._builtin_run_result(spec, request, await session.arun(request))
        return await self._web_async(spec, args)

    def _builtin_request(self, spec: ToolSpec, args: Mapping[str, Any]) -> RunRequest:
        from . import builtins

        if spec.name == "grep":
            policy = self.executor.policy
            argv, stdin = builtins.grep_request(
                args,
                workdir=str(policy.workdir),
                visible_roots=[str(root) for root in policy.visible_roots],
            )
        else:
            argv, stdin = builtins.bash_request(args)
        return RunRequest(
            argv=tuple(argv),
            stdin=stdin,
            timeout=self._timeout(spec),
            output_chars=self.executor.output_chars,
        )

    def _builtin_run_result(
        self, spec: ToolSpec, request: RunRequest, outcome: RunOutcome
    ) -> ToolResult:
        from . import builtins

        if spec.name == "bash":
            return self._run_result(spec, request, outcome, show_exit_code=True)
        result = self._run_result(spec, request, outcome)
        if outcome.timed_out:
            return result
        text, is_error = builtins.grep_finish(outcome.output, outcome.exit_code)
        if outcome.dropped_chars:
            text = render_output(
                text, exit_code=0, timed_out=False, dropped_chars=outcome.dropped_chars, timeout=0
            )
        return ToolResult(
            text=text,
            is_error=is_error,
            exit_code=outcome.exit_code,
            dropped_chars=outcome.dropped_chars,
            duration=outcome.duration,
            tool=spec.name,
            backend=result.backend,
            policy_id=result.policy_id,
        )

    def _file_result(self, spec: ToolSpec, text: str, is_error: bool) -> ToolResult:
        cap = self.executor.output_chars
        dropped = max(0, len(text) - cap)
        if dropped:
            text = render_output(
                text[:cap], exit_code=0, timed_out=False, dropped_chars=dropped, timeout=0
            )
        return ToolResult(
            text=text,
            is_error=is_error,
            dropped_chars=dropped,
            tool=spec.name,
            backend=self.executor.sandbox.name,
            policy_id=self.executor.policy.identity,
        )

    def _web_sync(self, spec: ToolSpec, args: Mapping[str, Any]) -> ToolResult:
        from ._webtools import web_call

        return web_call(self.executor, spec, args)

    async def _web_async(self, spec: ToolSpec, args: Mapping[str, Any]) -> ToolResult:
        from ._webtools import aweb_call

        return await aweb_call(self.executor, spec, args)

    # service and Python tools run in the host process (see the integrations docs).

    def _host_tool_sync(self, spec: ToolSpec, args: dict[str, Any]) -> ToolResult:
        from ._hosttools import host_call

        return host_call(self.executor, spec, args, timeout=self._timeout(spec))

    async def _host_tool_async(self, spec: ToolSpec, args: dict[str, Any]) -> ToolResult:
        from ._hosttools import ahost_call

        return await ahost_call(self.executor, spec, args, timeout=self._timeout(spec))


def _finish(result: ToolResult, spec: ToolSpec, started: float) -> ToolResult:
    return attrs.evolve(
        result, tool=spec.name, duration=result.duration or time.monotonic() - started
    )


def _json_bytes(args: Mapping[str, Any]) -> bytes:
    return json.dumps(args, ensure_ascii=False).encode("utf-8")


def _mounts(mounts: MountsArg | None) -> tuple[Mount, ...]:
    if mounts is None:
        return ()
    if isinstance(mounts, Mapping):
        result = []
        for target, source in mounts.items():
            text = str(source)
            writable = text.endswith(":rw")
            result.append(Mount.from_pair(target, text.removesuffix(":rw"), writable=writable))
        return tuple(result)
    return tuple(mounts)


def _resolve_backend(sandbox: Sandbox | str | None) -> Sandbox:
    if isinstance(sandbox, Sandbox):
        return sandbox
    from .sandbox._discovery import best_available, get_backend

    return best_available() if sandbox is None else get_backend(sandbox)

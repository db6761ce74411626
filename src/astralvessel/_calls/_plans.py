"""What a tool call's runner receives and what it hands back to the turn.

A runner (one per tool kind, one per built-in) turns a checked call into a
``Plan``: the one blocking step (``run``, or ``arun`` on an event loop), a pure
``finish`` from that step's outcome to a ``ToolResult``, and a ``rescue`` for
the failures the model should read rather than the host catch. ``Turn.call``
and ``Turn.acall`` share everything but the line that waits.

Runners see a ``TurnContext``: the few settings of the executor a call may
use, frozen when the turn opens. They never see the executor or the turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from ..results import ToolResult, render_command, render_file
from ..sandbox._api import FsReply, FsRequest
from ..sandbox._base import FileOutcome, RunOutcome, RunRequest, SandboxSession
from ..sandbox._policy import Policy

if TYPE_CHECKING:
    from ..web import AsyncTransport, Fetcher, Searcher, Transport

__all__ = [
    "Call",
    "FileToolRun",
    "Plan",
    "SandboxRun",
    "TurnContext",
    "view_outcome",
    "view_request",
]

_T = TypeVar("_T")


@attrs.frozen(kw_only=True)
class TurnContext:
    """What runners may use of the executor: settings and services, never its state."""

    policy: Policy
    #: ``policy.identity``, hashed once per executor.
    policy_id: str
    #: The name of the sandbox backend that runs the turn's confined calls.
    backend: str
    #: ``tool_output_chars``: the most characters of one result the model sees.
    output_chars: int
    fetcher: Fetcher
    searcher: Searcher | None
    #: Python callables the host bound to ``[services]`` names.
    services: Mapping[str, Callable[..., Any]]
    #: ``[services.NAME] url`` of the agent, by name.
    service_urls: Mapping[str, str]
    #: The transport service tools post through.
    transport: Transport | AsyncTransport


@attrs.frozen(kw_only=True)
class Call:
    """One call the executor has checked: the tool's name, its arguments and its timeout."""

    tool: str
    arguments: Mapping[str, Any]
    timeout: float


class Plan(Protocol[_T]):
    """One call, ready to run: the step that waits, and what its outcome becomes."""

    #: Whether the call runs in the turn's sandbox, and so is handed its session.
    @property
    def sandboxed(self) -> bool: ...

    def run(self, session: SandboxSession | None) -> _T:
        """Wait for the call in this thread; ``session`` is None unless ``sandboxed``."""
        ...

    async def arun(self, session: SandboxSession | None) -> _T:
        """Wait for the call in the running event loop; the same contract as ``run``."""
        ...

    def finish(self, outcome: _T) -> ToolResult:
        """The result the model sees for the step's outcome (pure)."""
        ...

    def rescue(self, exc: Exception) -> ToolResult | None:
        """The result for a failure of the step the model should read; None re-raises it."""
        ...


def _session(session: SandboxSession | None) -> SandboxSession:
    if session is None:  # pragma: no cover - the turn hands every sandboxed plan a session
        raise AssertionError("a sandboxed plan ran without the turn's session")
    return session


def _no_rescue(exc: Exception) -> ToolResult | None:
    return None


def _command_result(outcome: RunOutcome, timeout: float) -> ToolResult:
    return render_command(outcome, timeout=timeout)


@attrs.frozen(kw_only=True)
class SandboxRun:
    """A confined call in the turn's sandbox: a declared command, ``grep`` or ``bash``."""

    request: RunRequest
    #: The pure rule from the outcome and timeout to the result (``render_command``'s by default).
    finisher: Callable[[RunOutcome, float], ToolResult] = _command_result
    sandboxed: bool = attrs.field(default=True, init=False)

    def run(self, session: SandboxSession | None) -> RunOutcome:
        return _session(session).run(self.request)

    async def arun(self, session: SandboxSession | None) -> RunOutcome:
        return await _session(session).arun(self.request)

    def finish(self, outcome: RunOutcome) -> ToolResult:
        return self.finisher(outcome, self.request.timeout)

    rescue = staticmethod(_no_rescue)


def view_request(view: str, arguments: Mapping[str, Any], timeout: float) -> FsRequest:
    """The session request for one of the server's views (``lines``, ``find``, ``entries``)."""
    return FsRequest(op="view", view=view, arguments=arguments, timeout=timeout)


def _shown(text: str) -> str:
    """``text`` as valid Unicode for a model: a file name's undecodable bytes (which the
    sandbox sends as ``os.fsdecode``'s escapes) become U+FFFD, as a terminal shows them."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # another lone surrogate: no peer sends one, a fake might
        return text.encode("utf-8", "replace").decode("utf-8")


def view_outcome(reply: FsReply) -> FileOutcome:
    """A view's reply as the text the model reads; a worker failure is that text's error."""
    if reply.errno is not None:
        return FileOutcome(text=_shown(reply.message or reply.errno), is_error=True)
    return FileOutcome(
        text=_shown(str(reply.fields.get("text", ""))), is_error=bool(reply.fields.get("is_error"))
    )


@attrs.frozen(kw_only=True)
class FileToolRun:
    """``read``, ``glob`` or ``list``: the server's ``view`` of the sandbox's files."""

    call: Call
    view: str
    output_chars: int
    sandboxed: bool = attrs.field(default=True, init=False)

    def run(self, session: SandboxSession | None) -> FileOutcome:
        call = self.call
        return view_outcome(
            _session(session).fs(view_request(self.view, call.arguments, call.timeout))
        )

    async def arun(self, session: SandboxSession | None) -> FileOutcome:
        call = self.call
        request = view_request(self.view, call.arguments, call.timeout)
        return view_outcome(await _session(session).afs(request))

    def finish(self, outcome: FileOutcome) -> ToolResult:
        return render_file(outcome, cap=self.output_chars)

    rescue = staticmethod(_no_rescue)

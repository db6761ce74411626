"""What the host makes of the server's answers: each request kind's result, and the
frames that answer a request in one piece.

Pure functions over a finished ``Pending`` and the frame that ended it. They
return facts, no words: what stopped a call for memory (``_memory_notes``),
which outbox entries did not come back and why; ``results`` words them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import BackendUnavailableError, SandboxError, UsageError
from ._api import ExecResult, FsReply, RunOutcome
from ._memory_notes import limit_met, memory_stops
from ._pending import Pending
from .server._protocol import DETACH_NEEDS_NAMESPACES, DETACH_TURN_FULL, DETACHED_PER_TURN

__all__ = ["ANSWERS", "detached_result", "exec_result", "run_outcome"]


def _fs_reply(header: Mapping[str, Any], body: bytes) -> FsReply:
    """The worker's answer to a file primitive: its fields, the bytes read, or the refusal."""
    error = header.get("error")
    fields = {k: v for k, v in header.items() if k not in ("type", "id", "error")}
    if not isinstance(error, dict):
        return FsReply(fields=fields, data=body)
    return FsReply(
        fields=fields, errno=str(error.get("errno")), message=str(error.get("message", ""))[:2000]
    )


def _server_failed(header: Mapping[str, Any], body: bytes) -> SandboxError:
    return SandboxError(f"the sandbox server failed a call: {header.get('message')}")


#: Frames that answer a request in one piece, by type: each builds the answer (or the error).
ANSWERS: Mapping[str, Callable[[Mapping[str, Any], bytes], object]] = {
    "error": _server_failed,
    "fs_result": _fs_reply,
}


def run_outcome(item: Pending, bound: int) -> RunOutcome:
    """The call's result; ``bound`` (bytes) is the turn's memory group's as configured,
    for a note on the kernel's OOM killer that came without the limit it applied."""
    exit_info = item.exit or {}
    code = exit_info.get("exit_code")
    unlisted = exit_info.get("unlisted")
    return RunOutcome(
        output=bytes(item.output).decode("utf-8", "replace"),
        exit_code=code if isinstance(code, int) else None,
        timed_out=bool(exit_info.get("timed_out")),
        dropped_chars=int(exit_info.get("dropped_chars") or 0) + item.dropped_chars,
        files=tuple(item.files),
        duration=float(exit_info.get("duration") or 0.0),
        stopped_by_limit=limit_met(exit_info),
        memory=memory_stops(exit_info, bound),
        # A call that removed its outbox folder, swapped it for a link or made it
        # unreadable gets no file back, and is told why: an empty outbox says it left none.
        unlisted=unlisted if isinstance(unlisted, str) else "",
        skipped=dict(item.skipped),
        unwritten=item.unwritten,
    )


def exec_result(item: Pending, header: Mapping[str, Any], bound: int) -> ExecResult:
    """The exec's result, with what stopped it for memory (``bound`` as ``run_outcome``'s)."""
    code = header.get("exit_code")
    timed_out = bool(header.get("timed_out"))
    dropped = header.get("dropped_bytes") or {}
    server_cut = isinstance(dropped, dict) and any(
        isinstance(n, int) and n > 0 for n in dropped.values()
    )
    return ExecResult(
        # Killed with its tree past its timeout: SIGKILL's code, as a shell would report it.
        returncode=code if isinstance(code, int) and not timed_out else -9,
        stdout=bytes(item.streams["stdout"]),
        stderr=bytes(item.streams["stderr"]),
        timed_out=timed_out,
        truncated=item.stream_cut or server_cut,
        duration=max(0.0, float(header.get("duration") or 0.0)),
        stopped_by_limit=limit_met(header),
        memory=memory_stops(header, bound),
    )


#: Why the server refused a detached process (its ``refused`` reason): the error, and its words.
_DETACH_REFUSALS: Mapping[str, tuple[type[Exception], str]] = {
    DETACH_TURN_FULL: (
        UsageError,
        f"the turn already holds {DETACHED_PER_TURN} detached processes "
        "(each counts until everything it started has ended)",
    ),
    DETACH_NEEDS_NAMESPACES: (
        BackendUnavailableError,
        "a detached process needs a server that gives each call its own namespaces",
    ),
}


def detached_result(item: Pending, header: Mapping[str, Any], bound: int) -> object:
    """A detached process's end: its result, or the error that refused to start it
    (``bound`` as ``run_outcome``'s)."""
    refused = header.get("refused")
    if isinstance(refused, str):
        # Only the turn's bound or a server without namespaces refuses one.
        error_type, words = _DETACH_REFUSALS.get(refused, (BackendUnavailableError, refused))
        return error_type(words[:2000])
    code = header.get("exit_code")
    # Killed (by its timeout, ``kill``, the memory watch): SIGKILL's code.
    if not isinstance(code, int) or header.get("timed_out"):
        code = -9
    return ExecResult(
        returncode=code,
        stdout=bytes(item.output),
        timed_out=bool(header.get("timed_out")),
        truncated=item.cut or bool(header.get("dropped_chars")),
        duration=max(0.0, float(header.get("duration") or 0.0)),
        stopped_by_limit=limit_met(header),
        # Its log is stdout; what stopped it for memory is said apart, as an exec's.
        memory=memory_stops(header, bound),
    )

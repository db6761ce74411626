"""``Turn.exec`` on a fake turn: the host's commands answered from a script, as tool calls are.

A fake runs nothing (a real subprocess would run on the host, unconfined, and
make a test depend on what the host has installed), so the host's command is
answered the way ``FakeSandbox`` answers a tool call: from a table keyed by
the command, or by a function of it. The turn has already checked and built
the request exactly as on a real backend (argv, input, cwd, env and timeout
bounds raise ``UsageError`` before the fake sees anything); this module only
shapes the answer as a real session would return it: each stream cut at the
request's bound with ``truncated`` set, and a timed-out command's status -9.
"""

from __future__ import annotations

import concurrent.futures
import shlex
from collections.abc import Callable, Mapping
from typing import TypeAlias

import attrs

from ..errors import UnscriptedCallError, UsageError
from ..sandbox._api import DetachedProcess, DetachRequest, ExecRequest, ExecResult

__all__ = [
    "ExecAnswer",
    "ExecScript",
    "FakeExec",
    "answer_detach",
    "answer_exec",
    "check_exec_script",
]


@attrs.frozen(kw_only=True)
class FakeExec:
    """One ``Turn.exec`` as it reached a fake turn, recorded in ``FakeSandbox.execs``.

    ``cwd`` is the sandbox path the command would run in (the workdir when the
    host gave none); ``env`` the variables the host set over the clean
    environment; ``detached`` says it came from ``Turn.start`` (its
    ``timeout`` is then ``None`` for one that runs until the turn ends).
    """

    argv: tuple[str, ...]
    stdin: bytes = b""
    cwd: str
    env: Mapping[str, str] = attrs.field(factory=dict)
    timeout: float | None
    detached: bool = False


#: How the fake answers one exec: its stdout (exit 0), an ``ExecResult``, or a function of it.
ExecAnswer: TypeAlias = str | bytes | ExecResult | Callable[[FakeExec], str | bytes | ExecResult]
#: ``FakeSandbox(exec=...)``: answers by argv (a tuple, or its ``shlex.join`` line), or one for all.
ExecScript: TypeAlias = Mapping[tuple[str, ...] | str, ExecAnswer] | ExecAnswer


def check_exec_script(script: ExecScript | None) -> ExecScript | None:
    """The script as given; ``UsageError`` for a key that names no command."""
    if isinstance(script, Mapping):
        for key in script:
            if isinstance(key, str):
                if not key.strip():
                    raise UsageError("an exec answer's command line is empty")
            elif not (
                isinstance(key, tuple) and key and all(isinstance(part, str) for part in key)
            ):
                raise UsageError(
                    f"an exec answer is keyed by argv as a tuple of strings or its command "
                    f"line, not {key!r}"
                )
    return script


def _lookup(script: ExecScript | None, call: FakeExec) -> ExecAnswer | None:
    if not isinstance(script, Mapping):
        return script
    if call.argv in script:
        return script[call.argv]
    return script.get(shlex.join(call.argv))


def _cut(data: bytes, bound: int) -> tuple[bytes, bool]:
    return data[:bound], len(data) > bound


def _scripted(script: ExecScript | None, call: FakeExec) -> ExecResult:
    answer = _lookup(script, call)
    if answer is None:
        raise UnscriptedCallError(
            f"the fake sandbox has no answer for exec {list(call.argv)[:4]}; give it one in "
            f"exec={{{call.argv!r}: ...}} or exec=<a function of the FakeExec>"
        )
    value = answer(call) if callable(answer) else answer
    if isinstance(value, str):
        value = value.encode("utf-8")
    if isinstance(value, bytes):
        value = ExecResult(returncode=0, stdout=value)
    if not isinstance(value, ExecResult):
        raise UsageError(
            f"the fake answer for exec {list(call.argv)[:4]} gave a {type(value).__name__}; "
            "give str, bytes or ExecResult"
        )
    # A real command past its timeout is killed with its tree: SIGKILL's status.
    return attrs.evolve(value, returncode=-9) if value.timed_out else value


def answer_exec(script: ExecScript | None, call: FakeExec, request: ExecRequest) -> ExecResult:
    """The result a real session would return for ``call``, from the fake's script."""
    value = _scripted(script, call)
    stdout, cut_out = _cut(value.stdout, request.output_bytes)
    stderr, cut_err = _cut(value.stderr, request.output_bytes)
    return attrs.evolve(
        value, stdout=stdout, stderr=stderr, truncated=value.truncated or cut_out or cut_err
    )


def answer_detach(
    script: ExecScript | None, call: FakeExec, request: DetachRequest
) -> DetachedProcess:
    """A detached process that has already exited as the script says, as ``Turn.start`` returns it.

    Its result is shaped as a real one's: stdout and stderr merged into the log
    (``stdout``), cut at the request's bound, and ``stderr`` empty.
    """
    value = _scripted(script, call)
    log, cut = _cut(value.stdout + value.stderr, request.log_chars)
    future: concurrent.futures.Future[ExecResult] = concurrent.futures.Future()
    future.set_result(attrs.evolve(value, stdout=log, stderr=b"", truncated=value.truncated or cut))
    return DetachedProcess(call.argv, future, lambda: None)

"""Helpers that make a confined call read like one line of a test."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import attrs

from astralvessel import Turn
from astralvessel._calls._plans import view_outcome, view_request
from astralvessel.results import command_output
from astralvessel.sandbox import FileOutcome, RunOutcome, RunRequest, SandboxSession

__all__ = [
    "afile_tool",
    "barrier",
    "file_tool",
    "host_processes_with",
    "py",
    "py_json",
    "run",
    "run_script",
    "wait_until_gone",
]

#: The server's view each built-in file tool shows (as its row in ``builtins`` plans it).
VIEWS = {"read": "lines", "glob": "find", "list": "entries"}

#: The interpreter calls use: the sandbox's own (the host's /usr, read-only).
PYTHON = "/usr/bin/python3"


def run(
    session: SandboxSession,
    *argv: str,
    timeout: float = 30.0,
    stdin: bytes = b"",
    output_chars: int = 100_000,
) -> RunOutcome:
    """Run ``argv`` as one confined call of ``session``; its ``output`` as the model reads
    it, with the notes ``results`` words from what the session reported (memory, outbox)."""
    outcome = session.run(
        RunRequest(argv=argv, stdin=stdin, timeout=timeout, output_chars=output_chars)
    )
    return attrs.evolve(outcome, output=command_output(outcome))


def file_tool(
    session: SandboxSession, tool: str, arguments: dict[str, Any], *, timeout: float = 10.0
) -> FileOutcome:
    """What the built-in file tool ``tool`` shows for ``arguments``, through the session's fs."""
    return view_outcome(session.fs(view_request(VIEWS[tool], arguments, timeout)))


async def afile_tool(
    session: SandboxSession, tool: str, arguments: dict[str, Any], *, timeout: float = 10.0
) -> FileOutcome:
    """Async twin of ``file_tool``."""
    return view_outcome(await session.afs(view_request(VIEWS[tool], arguments, timeout)))


def py(session: SandboxSession, code: str, **kwargs: Any) -> RunOutcome:
    """Run Python ``code`` (dedented) as one confined call."""
    return run(session, PYTHON, "-c", textwrap.dedent(code), **kwargs)


def py_json(session: SandboxSession, code: str, **kwargs: Any) -> Any:
    """Run ``code``, which prints one JSON value last, and return that value."""
    outcome = py(session, code, **kwargs)
    assert outcome.exit_code == 0, outcome.output
    return json.loads(outcome.output.strip().splitlines()[-1])


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # Another process's arguments may be any bytes (a test of hostile names).
                raw = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                cmdline = raw.decode("utf-8", "replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(int(entry.name))
    return found


def wait_until_gone(marker: str, seconds: float = 5.0) -> list[int]:
    """Wait until no host process matches ``marker``; return those still there after ``seconds``."""
    # The kernel tears a PID namespace down asynchronously; give it a moment.
    deadline = time.monotonic() + seconds
    while (left := host_processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def barrier(folder: str, name: str, parties: int, *, stall_s: int = 20) -> str:
    """A script that checks in at ``folder`` and waits for ``parties`` check-ins: ``met`` or ``alone``.

    The wait gives up after ``stall_s`` seconds with no new check-in, however
    long the check-ins take to come all together: calls that start slowly on a
    loaded host, but do overlap, keep arriving. Calls that run one at a time
    never see a second check-in, so the first prints ``alone`` after
    ``stall_s`` seconds and leaves a mark that sends the later ones away at once
    (not ``stall_s`` each): the proof of overlap is the rendezvous itself, not a
    clock.
    """
    return (
        f'touch "{folder}/in-{name}"; '
        f"seen=0; i=0; while [ $i -lt {stall_s * 10} ]; do "
        f'n=$(ls "{folder}" | grep -c "^in-"); '
        f"[ $n -ge {parties} ] && {{ echo met; exit 0; }}; "
        f'[ -e "{folder}/gave-up" ] && {{ echo alone; exit 0; }}; '
        f"[ $n -gt $seen ] && {{ seen=$n; i=0; }}; "
        f'sleep 0.1; i=$((i+1)); done; touch "{folder}/gave-up"; echo alone'
    )


def run_script(turn: Turn, script: str) -> str:
    """Run ``script`` with ``sh -c`` through ``Turn.exec``; assert it succeeded; its stdout."""
    result = turn.exec(["sh", "-c", script])
    assert result.returncode == 0, result.stderr
    return result.stdout.decode("utf-8", "backslashreplace")

"""128 turns at once on bubblewrap, nsjail and Docker, each making Python tool calls: not one error.

Eval harnesses open a turn per sample, hundreds at a time. Every turn here is
opened by its own thread at once, calls a Python tool several times through
the executor (the whole path a host uses), and closes; a turn that fails to
open, a call that errs or answers wrongly, counts. On a root host the turns
also hold 128 distinct host uids while they overlap.

Marked ``scale``: CI runs it on the full-matrix Python only (see noxfile.py).

Docker runs it with the engine gate's default bound (8 container starts,
removals and execs at once, see docs/docker.md): unbounded, 128 starts at once
once left a ``runc create`` and its ``runc init`` waiting on each other and
wedged the engine for the machine. ``docker-exec`` runs it too: each of its
calls is a ``runc exec`` the engine runs after answering the request, so it
holds its place in the bound until the exec's first byte, and a call's timeout
starts only then (before, 11 of 128 first calls outlasted their 30 s timeout
waiting inside the engine).
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from astralvessel import Executor, Registry, ToolSpec
from astralvessel.sandbox import Limits
from astralvessel.sandbox._discovery import get_backend

TURNS = 128
CALLS = 3
#: Small limits: 128 turns of the default 1 GiB each would ask the engine for 128 GiB.
LIMITS = Limits(memory_mb=128, disk_mb=8, processes=16, open_files=128)
#: Reads its argument as JSON on stdin, as a declared tool does by default.
SQUARE = ToolSpec.command_tool(
    "square",
    "Square a number.",
    ["python3", "-c", "import json,sys; print(json.load(sys.stdin)['n'] ** 2)"],
)


@pytest.mark.scale
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["bubblewrap", "nsjail", "docker", "docker-exec"])
def test_128_turns_at_once(name: str) -> None:
    """128 turns, all alive at once, each call Python 3 times through the executor: 0 errors."""
    assert _wrong_answers(name, TURNS) == []


def _wrong_answers(name: str, turns: int) -> list[tuple[int, list[str]]]:
    """Open ``turns`` turns at once on backend ``name``; the turns whose answers were not right."""
    executor = Executor(Registry([SQUARE]), sandbox=get_backend(name), limits=LIMITS)
    # Each turn waits here after its first answer, so all its sandboxes live at one moment.
    all_open = threading.Barrier(turns, timeout=600)

    def one(number: int) -> list[str]:
        texts = []
        try:
            with executor.turn() as turn:
                for call in range(CALLS):
                    result = turn.call("square", {"n": number + call})
                    texts.append(("error: " if result.is_error else "") + result.text.strip())
                    if call == 0:
                        all_open.wait()
        except BaseException:
            all_open.abort()  # the others stop waiting for a turn that will never come
            raise
        return texts

    with concurrent.futures.ThreadPoolExecutor(turns) as pool:
        answers = list(pool.map(one, range(turns)))
    expected = [[str((n + c) ** 2) for c in range(CALLS)] for n in range(turns)]
    return [(n, got) for n, got in enumerate(answers) if got != expected[n]]

"""Each turn has a process budget of its own: many turns and a fork bomb do not disturb each other."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from astralvessel.errors import SandboxError
from astralvessel.sandbox import Limits, Policy, RunOutcome, SandboxSession
from astralvessel.sandbox._base import RunRequest
from astralvessel.sandbox._discovery import get_backend

TURNS = 64
CALLS_PER_TURN = 3
LIMITS = Limits(processes=32, memory_mb=256, disk_mb=8, open_files=256)

#: Forks until the process limit refuses, keeps every child alive, then waits to be killed.
BOMB = """
import os, sys, time
children = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    children += 1
print(children, flush=True)
time.sleep(600)
"""


def _bomb_processes(marker: str) -> int:
    """How many host processes carry ``marker`` in their command line."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    count += 1
            except OSError:
                continue
    return count


def _one_turn(name: str, number: int) -> list[RunOutcome]:
    """Open a turn, call Python in it a few times, close it."""
    session = get_backend(name).start(Policy(limits=LIMITS))
    try:
        return [
            session.run(
                RunRequest(
                    argv=["python3", "-c", f"print({number} * {call})"],
                    timeout=120.0,
                    output_chars=1000,
                )
            )
            for call in range(CALLS_PER_TURN)
        ]
    finally:
        session.close()


@pytest.mark.parametrize("name", ["bubblewrap", "nsjail"])
def test_many_turns_beside_a_fork_bomb(name: str) -> None:
    """64 turns at once each call Python several times while another turn holds a fork bomb."""
    marker = f"bomb-{uuid.uuid4().hex}"
    bomb_session: SandboxSession = get_backend(name).start(Policy(limits=LIMITS))
    bomb_done = threading.Event()

    def bomb() -> None:
        try:
            bomb_session.run(
                RunRequest(argv=["python3", "-c", BOMB, marker], timeout=600.0, output_chars=1000)
            )
        except SandboxError:
            pass  # closed under it, as intended
        finally:
            bomb_done.set()

    bomber = threading.Thread(target=bomb)
    bomber.start()
    try:
        # The bomb holds its whole budget (every process but init) before the turns start.
        deadline = time.monotonic() + 60
        while _bomb_processes(marker) < LIMITS.processes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _bomb_processes(marker) == LIMITS.processes
        with concurrent.futures.ThreadPoolExecutor(TURNS) as pool:
            turns = list(pool.map(lambda n: _one_turn(name, n), range(TURNS)))
        assert not bomb_done.is_set(), "the bomb ended before the turns did"
    finally:
        bomb_session.close()
        bomber.join()
    problems = [
        (number, call, outcome.output)
        for number, outcomes in enumerate(turns)
        for call, outcome in enumerate(outcomes)
        if outcome.exit_code != 0 or outcome.output != f"{number * call}\n"
    ]
    assert problems == []

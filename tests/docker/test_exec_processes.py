"""docker-exec's process limit is each turn's own: a leased host uid per turn, orphans reaped.

A call's ``ulimit -p`` is the kernel's RLIMIT_NPROC, counted per host uid. Every
``docker-exec`` turn's calls once ran as uid 65534, so many turns shared one
count and a forking tool met ``Cannot fork`` below its own limit. Each turn now
leases a host uid, and the container's first process reaps what killed calls
leave, so neither other turns nor a turn's own past calls use up its limit.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from astralvessel.sandbox import Limits, Mount, Policy, RunOutcome, RunRequest, SandboxSession
from astralvessel.sandbox.docker import DockerExec

from .conftest import NOPYTHON_IMAGE

#: Each call's own process limit; a call is the first of its processes.
PROCESSES = 16
#: Turns forking to their limit at once, beside one running a fork bomb.
TURNS = 12
#: Children a call starts to sit at its limit: the call's shell, these, and one transient
#: ``sleep`` of its waiting loop make ``PROCESSES``.
CHILDREN = PROCESSES - 2

#: Forks ``CHILDREN`` sleepers, says so in /shared, then waits (forking one ``sleep`` at a
#: time) until the host says go: every turn holds its limit's worth of processes at once.
#: ``: >`` makes a file without a fork.
FORK_TO_LIMIT = (
    'i=0; while [ "$i" -lt "$1" ]; do sleep 600 & i=$((i + 1)); done; '
    ': >"/shared/ready-$2"; '
    "while [ ! -e /shared/go ]; do sleep 0.1; done; echo forked-all"
)
#: What a fork bomb comes to in ``sh``, where a refused fork ends the shell that tried it:
#: a subshell forks sleepers until its fork is refused, so the call holds its whole limit;
#: the call itself forks nothing more, says so, and spins on builtins alone until go.
HOG = (
    "(while :; do sleep 600 & done); : >/shared/ready-hog; "
    "while [ ! -e /shared/go ]; do :; done; echo hog-over"
)
#: A classic fork bomb, in a subshell (the call forks once, before the bomb fills its limit):
#: its processes fork until refused, then die out.
FORK_BOMB = "(b() { b | b & }; b) & echo launched"


def _run(session: SandboxSession, script: str, *args: str, timeout: float = 120.0) -> RunOutcome:
    argv = ["/bin/sh", "-c", script, "sh", *args]
    return session.run(RunRequest(argv=argv, timeout=timeout, output_chars=20_000))


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A folder every turn may write (1777), where calls meet the host's go."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def _policy(shared: Path) -> Policy:
    """A turn at ``PROCESSES`` with ``shared`` at /shared."""
    return Policy(
        limits=Limits(disk_mb=16, memory_mb=256, processes=PROCESSES, open_files=256),
        mounts=(Mount.from_pair("/shared", shared, writable=True),),
    )


@pytest.fixture
def turns(docker_api: object, shared: Path) -> Iterator[list[SandboxSession]]:
    """``TURNS + 1`` docker-exec turns at ``PROCESSES``, started at once, sharing /shared."""
    policy = _policy(shared)
    backend = DockerExec(image=NOPYTHON_IMAGE, pull=False)
    opened: list[SandboxSession] = []
    lock = threading.Lock()

    def start(_: int) -> None:
        session = backend.start(policy)
        with lock:
            opened.append(session)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(start, range(TURNS + 1)))
        yield opened
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: s.close(), opened))


def _wait_for(folder: Path, names: set[str], seconds: float) -> set[str]:
    """Wait until ``folder`` holds every name (or the time is up); the names still missing."""
    deadline = time.monotonic() + seconds
    missing = set(names)
    while missing and time.monotonic() < deadline:
        missing -= set(os.listdir(folder))
        time.sleep(0.1)
    return missing


def test_each_turn_forks_to_its_own_limit_beside_a_full_one(
    turns: list[SandboxSession], shared: Path
) -> None:
    """Twelve turns each hold their whole process limit at once beside a turn that forked until refused."""
    hog_turn, *forking = turns
    users = {session._user for session in turns}  # type: ignore[attr-defined]
    assert len(users) == len(turns), users
    with ThreadPoolExecutor(len(turns)) as pool:
        hog = pool.submit(_run, hog_turn, HOG)
        assert not _wait_for(shared, {"ready-hog"}, 60), hog.result()
        calls = [
            pool.submit(_run, session, FORK_TO_LIMIT, str(CHILDREN), str(index))
            for index, session in enumerate(forking)
        ]
        ready = {f"ready-{index}" for index in range(len(forking))}
        missing = _wait_for(shared, ready, 120)
        (shared / "go").touch()
        outcomes = [call.result() for call in calls]
        hogged = hog.result()
    assert not missing, [o.output for o in outcomes]
    for outcome in outcomes:
        assert (outcome.exit_code, outcome.output) == (0, "forked-all\n")
    assert hogged.exit_code == 0, hogged.output
    assert "Cannot fork" in hogged.output
    assert hogged.output.endswith("hog-over\n")
    # Each limit still holds: one process more than a call allows is refused.
    over = _run(forking[0], FORK_TO_LIMIT, str(PROCESSES), "over", timeout=30)
    assert "Cannot fork" in over.output
    assert over.exit_code != 0


@pytest.fixture
def turn(docker_api: object, shared: Path) -> Iterator[SandboxSession]:
    """One docker-exec turn at ``PROCESSES``, with /shared."""
    session = DockerExec(image=NOPYTHON_IMAGE, pull=False).start(_policy(shared))
    try:
        yield session
    finally:
        session.close()


def test_a_fork_bomb_leaves_nothing_against_the_turns_next_calls(
    turn: SandboxSession, shared: Path
) -> None:
    """After a fork bomb and calls whose children were killed, the same turn forks its limit again
    (one turn: the twelve others of ``turns`` took no part in it)."""
    session = turn
    (shared / "go").touch()
    # A first round fails at ``left`` where nothing reaps the bomb's orphans (checked); the
    # second shows that reaping them once left the turn as it found it, ready for more.
    for round_ in range(2):
        bombed = _run(session, FORK_BOMB)
        assert bombed.exit_code == 0, bombed.output
        left = _run(session, f"for i in $(seq {CHILDREN}); do sleep 600 & done; echo left")
        assert left.output == "left\n"
        again = _run(session, FORK_TO_LIMIT, str(CHILDREN), f"again-{round_}")
        assert (again.exit_code, again.output) == (0, "forked-all\n")

"""Each turn its own host identity on a root host; an ordinary user's turns are that user.

As root, every turn leases a host uid (and the same gid) of its own from the
configured range: two live turns never share one, what one turn leaves in a
shared writable mount is closed to another, the host can still use it, and
the uid is free again once the turn closes or its host dies. As an ordinary
user an unprivileged user namespace can map only the user's own id, so every
turn is that user; these tests check that instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from astralvessel.errors import BackendUnavailableError
from astralvessel.sandbox import Mount, Policy, RunOutcome, Sandbox, SandboxSession
from astralvessel.sandbox._uids import DEFAULT_UID_RANGE, UidRange

from .calls import host_processes_with, run

ROOT = os.geteuid() == 0
#: The group a host shares a writable folder with (set-gid): no user or turn has it.
SHARED_GID = 4_242_421
#: A host user of that group, who reads what turns wrote there.
HOST_READER = 4_242_422


def _host_ids(marker: str) -> set[tuple[int, int]]:
    """The real uids and gids of the host processes whose command line holds ``marker``."""
    found = set()
    for pid in host_processes_with(marker):
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue  # a short-lived fork (the waiting loop's sleep) already gone
        fields = dict(line.split(":", 1) for line in text.splitlines())
        found.add((int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])))
    return found


def _private_range() -> UidRange:
    """A one-id range of this test alone: outside the default, apart from concurrent runs."""
    first = DEFAULT_UID_RANGE.last + 1 + (os.getpid() % 4096) * 64 + os.urandom(1)[0]
    return UidRange(first, 1)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the host lets every turn write (1777) and shares with its group (set-gid)."""
    folder = Path(tempfile.mkdtemp(prefix="astralvessel-shared-"))
    try:
        if ROOT:
            os.chown(folder, -1, SHARED_GID)
        folder.chmod(0o3777)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def two_turns(backend: Sandbox, policy: Policy, shared_dir: Path) -> Iterator[list[SandboxSession]]:
    """Two live turns of the backend, each mounting ``shared_dir`` writable at /shared."""
    shared = attrs.evolve(
        policy, mounts=(*policy.mounts, Mount.from_pair("/shared", shared_dir, writable=True))
    )
    turns: list[SandboxSession] = []
    try:
        for _ in range(2):
            turns.append(backend.start(shared))
        yield turns
    finally:
        for turn in turns:
            turn.close()


def test_two_live_turns_are_two_host_uids(
    two_turns: list[SandboxSession], shared_dir: Path
) -> None:
    """Two turns' calls, running at once, are two host uids of the range (the host user's as non-root)."""
    token = os.urandom(6).hex()
    outcomes: list[RunOutcome] = []

    def wait_in(turn: SandboxSession, name: str) -> None:
        script = "while [ ! -e /shared/go ]; do sleep 0.05; done; id -u"
        outcomes.append(run(turn, "sh", "-c", script, f"av-{token}-{name}"))

    threads = [
        threading.Thread(target=wait_in, args=(turn, name))
        for turn, name in zip(two_turns, "ab", strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        ids: dict[str, set[tuple[int, int]]] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(ids) < 2:
            ids = {n: found for n in "ab" if (found := _host_ids(f"av-{token}-{n}"))}
            time.sleep(0.05)
    finally:
        (shared_dir / "go").touch()
        for thread in threads:
            thread.join(60)
    assert len(ids) == 2, ids
    (a,), (b,) = ids["a"], ids["b"]
    if ROOT:
        assert a != b
        for uid, gid in (a, b):
            assert uid == gid
            assert DEFAULT_UID_RANGE.first <= uid <= DEFAULT_UID_RANGE.last
    else:
        assert a == b == (os.getuid(), os.getgid())
    assert [o.exit_code for o in outcomes] == [0, 0]


def test_calls_are_uid_65534_inside(two_turns: list[SandboxSession]) -> None:
    """Whatever host uid a turn has, its calls see themselves as uid and gid 65534."""
    for turn in two_turns:
        assert run(turn, "sh", "-c", "id -u; id -g").output.split() == ["65534", "65534"]


def test_a_turns_files_are_closed_to_another_turn(
    two_turns: list[SandboxSession], shared_dir: Path
) -> None:
    """What turn A writes in a shared writable mount, turn B cannot read, list into or remove."""
    first, second = two_turns
    wrote = run(
        first, "sh", "-c", "echo secret > /shared/a.txt && mkdir /shared/d && echo x > /shared/d/f"
    )
    assert wrote.exit_code == 0, wrote.output
    read = run(
        second, "sh", "-c", "cat /shared/a.txt; ls /shared/d; rm -f /shared/a.txt; echo done"
    )
    if ROOT:
        assert "secret" not in read.output
        assert read.output.count("Permission denied") >= 2, read.output
        assert (shared_dir / "a.txt").read_text() == "secret\n"
    else:
        # One user: the turns share what the user may do (see the threat model).
        assert "secret" in read.output


def test_the_host_can_use_and_remove_what_a_turn_wrote(
    two_turns: list[SandboxSession], shared_dir: Path
) -> None:
    """A turn's files carry the shared folder's group, readable by it; the host removes them."""
    wrote = run(
        two_turns[0],
        "sh",
        "-c",
        "mkdir -p /shared/out/deep && echo result > /shared/out/deep/r.txt",
    )
    assert wrote.exit_code == 0, wrote.output
    made = shared_dir / "out" / "deep" / "r.txt"
    if ROOT:
        for path in (shared_dir / "out", shared_dir / "out" / "deep", made):
            info = path.stat()
            assert info.st_gid == SHARED_GID, path
            assert info.st_mode & 0o060 == 0o060, oct(info.st_mode)
            assert info.st_mode & 0o007 == 0, oct(info.st_mode)
        # A host user of the folder's group (not root, not the turn) reads the result.
        seen = subprocess.run(
            ["cat", "out/deep/r.txt"],
            cwd=shared_dir,
            user=HOST_READER,
            group=HOST_READER,
            extra_groups=[SHARED_GID],
            capture_output=True,
            text=True,
            check=False,
        )
        assert seen.stdout == "result\n", seen.stderr
    else:
        assert made.stat().st_uid == os.getuid()
        assert made.read_text() == "result\n"
    shutil.rmtree(shared_dir / "out")
    assert not (shared_dir / "out").exists()


def test_uids_return_when_turns_close_and_exhaustion_is_one_error(
    backend: Sandbox, policy: Policy
) -> None:
    """A one-id range serves one live turn; a second is refused by name; closing frees the id."""
    narrow = attrs.evolve(policy, uid_range=_private_range())
    first = backend.start(narrow)
    try:
        if ROOT:
            with pytest.raises(BackendUnavailableError, match=str(narrow.uid_range)) as caught:
                backend.start(narrow).close()
            assert "widen the range" in str(caught.value)
        else:
            # An ordinary user's turns lease nothing: the range does not apply.
            backend.start(narrow).close()
    finally:
        first.close()
    again = backend.start(narrow)
    try:
        assert run(again, "true").exit_code == 0
    finally:
        again.close()


HOST = """
import sys, time
from astralvessel.sandbox import Policy
from astralvessel.sandbox._discovery import get_backend
session = get_backend(sys.argv[1]).start(Policy())
print("ready", flush=True)
time.sleep(600)
"""


def test_a_killed_hosts_uids_do_not_leak(backend: Sandbox, policy: Policy) -> None:
    """A host killed with SIGKILL while its turn lives leaves its uid free for the next turn."""
    narrow = _private_range()
    env = {**os.environ, "ASTRALVESSEL_UID_RANGE": str(narrow)}
    with subprocess.Popen(
        [sys.executable, "-c", HOST, backend.name], env=env, stdout=subprocess.PIPE, text=True
    ) as host:
        try:
            assert host.stdout is not None
            assert host.stdout.readline() == "ready\n"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(host.pid, signal.SIGKILL)
            host.wait(30)
    turn = backend.start(attrs.evolve(policy, uid_range=narrow))
    turn.close()

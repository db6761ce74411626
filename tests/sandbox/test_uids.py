"""The per-turn uid range and its host-wide leases (``sandbox/_uids``), on real lock files."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import attrs
import docker.errors
import pytest
import requests

from astralvessel import Executor, Registry
from astralvessel.errors import BackendUnavailableError, UsageError
from astralvessel.sandbox import DEFAULT_UID_RANGE, Policy, UidRange
from astralvessel.sandbox._uids import (
    UID_RANGE_ENV,
    lease_uid,
    remove_free_locks,
    resolve_range,
)
from astralvessel.sandbox.docker._attach import AttachChannel


def test_the_default_range_avoids_every_allocated_block() -> None:
    """The default sits in systemd's unallocated block: above containers' ranges, below 2^31."""
    assert DEFAULT_UID_RANGE.first > 1_879_048_191  # systemd-nspawn's container ranges end here
    assert DEFAULT_UID_RANGE.last < 2_147_352_576  # systemd's "foreign" range starts here
    assert str(DEFAULT_UID_RANGE) == "2013265920-2013331455"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0-100", "starts at 1000"),
        ("60000-70000", "reserved id"),
        ("5000-4000", "ends before it starts"),
        ("2147483000-2147483647", "ends at"),
        ("1000", "FIRST-LAST"),
        ("a-b", "FIRST-LAST"),
    ],
)
def test_bad_ranges_are_refused(text: str, why: str) -> None:
    """A range holding root, nobody, 65535, an id past 2^31-2, or not FIRST-LAST is a UsageError."""
    with pytest.raises(UsageError, match=why):
        UidRange.parse(text)


def test_every_construction_path_checks_the_range() -> None:
    """UidRange(...), attrs.evolve and Policy(uid_range=text) run the same checks."""
    with pytest.raises(UsageError):
        UidRange(65000, 1000)
    with pytest.raises(UsageError):
        attrs.evolve(DEFAULT_UID_RANGE, count=0)
    assert Policy(uid_range="3000000-3000009").uid_range == UidRange(3_000_000, 10)
    with pytest.raises(UsageError):
        Policy(uid_range="1-2")


def test_the_range_is_not_part_of_the_policy_identity() -> None:
    """Who calls are on the host does not change what confines them: the policy id stays."""
    assert Policy(uid_range="3000000-3000009").identity == Policy().identity


def test_resolve_prefers_the_executor_then_the_environment() -> None:
    """The chosen range wins; else the variable; else the default; a bad variable names itself."""
    chosen = UidRange(3_000_000, 5)
    assert resolve_range(chosen, {UID_RANGE_ENV: "4000000-4000001"}) is chosen
    assert resolve_range(None, {UID_RANGE_ENV: "4000000-4000001"}) == UidRange(4_000_000, 2)
    assert resolve_range(None, {}) == DEFAULT_UID_RANGE
    with pytest.raises(UsageError, match=UID_RANGE_ENV):
        resolve_range(None, {UID_RANGE_ENV: "nonsense"})


def test_executor_takes_a_range(tmp_path: Path) -> None:
    """Executor(uid_range=...) puts the range on its policy."""
    executor = Executor(Registry(), sandbox="unconfined", uid_range="3000000-3000099")
    assert executor.policy.uid_range == UidRange(3_000_000, 100)


def test_leases_are_distinct_under_contention_and_exhaustion_is_one_error(tmp_path: Path) -> None:
    """32 threads lease a 24-id range at once: 24 distinct ids, 8 clear refusals naming the range."""
    small = UidRange(3_000_000, 24)
    got: list[int] = []
    refused: list[str] = []
    leases = []
    lock = threading.Lock()
    start = threading.Barrier(32)

    def take() -> None:
        start.wait()
        try:
            lease = lease_uid(small, str(tmp_path))
        except BackendUnavailableError as exc:
            with lock:
                refused.append(str(exc))
            return
        with lock:
            got.append(lease.uid)
            leases.append(lease)

    threads = [threading.Thread(target=take) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == list(range(small.first, small.last + 1))
    assert len(refused) == 8
    assert all(str(small) in text and "widen the range" in text for text in refused)
    leases[0].release()
    leases[0].release()  # idempotent
    again = lease_uid(small, str(tmp_path))
    assert again.uid == leases[0].uid
    for lease in (again, *leases):
        lease.release()


def test_another_process_holding_a_uid_is_respected(tmp_path: Path) -> None:
    """A lease held by another process is skipped; it comes back the moment that process dies."""
    one = UidRange(3_000_000, 1)
    holder = (
        "import sys, time\n"
        "from astralvessel.sandbox._uids import UidRange, lease_uid\n"
        f"lease = lease_uid(UidRange(3_000_000, 1), {str(tmp_path)!r})\n"
        "print(lease.uid, flush=True)\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "3000000\n"
            with pytest.raises(BackendUnavailableError):
                lease_uid(one, str(tmp_path))
        finally:
            process.kill()
            process.wait()
    lease_uid(one, str(tmp_path)).release()


# A lessee: leases an id of a 2-id range again and again (taken ids are tried again), marks it
# held with a file only one process can create, and prints how many leases it had and every
# id it found marked by another (two live leases of one id).
LESSEE = """
import os, sys
from astralvessel.errors import BackendUnavailableError
from astralvessel.sandbox._uids import UidRange, lease_uid
locks, marks, wanted = sys.argv[1], sys.argv[2], int(sys.argv[3])
had = 0
while had < wanted:
    try:
        lease = lease_uid(UidRange(3_000_000, 2), locks)
    except BackendUnavailableError:
        continue
    mark = os.path.join(marks, str(lease.uid))
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        print("twice", lease.uid, flush=True)
    else:
        os.sched_yield()
        os.unlink(mark)
    lease.release()
    had += 1
print("had", had, flush=True)
"""


@pytest.mark.slow
def test_ended_leases_leave_no_lock_file_and_no_id_is_held_twice(tmp_path: Path) -> None:
    """Six processes lease and end leases of two ids 300 times each: no id is ever held by two
    at once (a lock file unlinked under a lessee that opened it is never its lease), and once
    every lease has ended the lock folder is empty."""
    locks, marks = tmp_path / "locks", tmp_path / "marks"
    marks.mkdir()
    lessees = [
        subprocess.Popen(
            [sys.executable, "-c", LESSEE, str(locks), str(marks), "300"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outputs = [lessee.communicate(timeout=600)[0] for lessee in lessees]
    assert [lessee.returncode for lessee in lessees] == [0] * 6
    assert [line for out in outputs for line in out.splitlines() if line.startswith("twice")] == []
    assert all(out.endswith("had 300\n") for out in outputs)
    assert sorted(os.listdir(locks)) == []


def test_a_lock_on_an_unlinked_file_is_no_lease(tmp_path: Path) -> None:
    """A late lessee opened the file before its release and locks it after: that lock is on a
    file the path no longer names, so it blocks no one; the path's new file is the lease."""
    one = UidRange(3_000_000, 1)
    first = lease_uid(one, str(tmp_path))
    path = tmp_path / "3000000.lock"
    opened = os.open(path, os.O_RDWR)  # another lessee's open, before the release
    try:
        first.release()
        assert not path.exists()
        second = lease_uid(one, str(tmp_path))  # makes the path's new file and holds it
        assert path.exists()
        # The late lessee's lock on the old file succeeds, but the path names another file.
        fcntl.flock(opened, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BackendUnavailableError):
            lease_uid(one, str(tmp_path))
        second.release()
    finally:
        os.close(opened)
    assert os.listdir(tmp_path) == []


def test_a_first_lease_removes_the_lock_files_no_lease_holds(tmp_path: Path) -> None:
    """The files an older version left (one per uid it ever leased) go at a process's first
    lease in the folder; the file another process's live lease holds, and other files, stay."""
    holder = (
        "import sys, time\n"
        "from astralvessel.sandbox._uids import UidRange, lease_uid\n"
        f"lease = lease_uid(UidRange(3_000_000, 1), {str(tmp_path)!r})\n"
        "print(lease.uid, flush=True)\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "3000000\n"
            for uid in range(3_000_100, 3_000_400):
                (tmp_path / f"{uid}.lock").touch(mode=0o600)
            (tmp_path / "notes.txt").write_text("not a lock\n")
            lease = lease_uid(UidRange(3_000_001, 1), str(tmp_path))
            assert sorted(os.listdir(tmp_path)) == ["3000000.lock", "3000001.lock", "notes.txt"]
            lease.release()
        finally:
            process.kill()
            process.wait()
    assert remove_free_locks(str(tmp_path)) == 1  # the killed holder's
    assert os.listdir(tmp_path) == ["notes.txt"]
    for uid in range(3_000_100, 3_000_150):
        (tmp_path / f"{uid}.lock").touch(mode=0o600)
    assert remove_free_locks(str(tmp_path), 20) == 20  # a bounded sweep: the rest stay
    assert len(os.listdir(tmp_path)) == 31


def test_an_unsafe_lock_folder_is_refused(tmp_path: Path) -> None:
    """A lock folder others may write is refused: anyone could otherwise squat every uid."""
    folder = tmp_path / "locks"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(BackendUnavailableError, match="writable by it alone"):
        lease_uid(UidRange(3_000_000, 1), str(folder))


class _Engine:
    """An engine API whose container removal fails as the engine says (the one fake here:
    a real engine cannot be made to refuse a removal on demand)."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def inspect_container(self, container_id: str) -> dict[str, object]:
        return {"State": {"Running": False, "ExitCode": 0}}

    def remove_container(self, container_id: str, *, force: bool) -> None:
        if self.error is not None:
            raise self.error


def _not_found() -> Exception:
    response = requests.Response()
    response.status_code = 404
    return docker.errors.NotFound("no such container", response=response)


@pytest.mark.parametrize(
    ("error", "released"),
    [(None, True), ("not-found", True), (RuntimeError("engine timed out"), False)],
)
def test_a_docker_turns_uid_goes_back_only_once_its_container_is_gone(
    tmp_path: Path, error: object, released: bool
) -> None:
    """The lease returns when the engine removed the container (or it was gone), else stays held."""
    one = UidRange(3_000_000, 1)
    lease = lease_uid(one, str(tmp_path))
    failure = _not_found() if error == "not-found" else error
    ours, _theirs = socket.socketpair()
    try:
        channel = AttachChannel(
            _Engine(failure if isinstance(failure, Exception) else None),
            "c0ffee",
            ours,
            engine="test",
            on_close=lease.release,
        )
        channel.close()
        if released:
            lease_uid(one, str(tmp_path)).release()
        else:
            with pytest.raises(BackendUnavailableError):
                lease_uid(one, str(tmp_path))
    finally:
        lease.release()
        _theirs.close()

"""The engine bound shared by host processes: lock files that real processes count against together.

Each worker is a real host process (multiprocessing, spawned) with its own
client of the real engine, gated by the same folder of lock files; while it
holds a place it sends the engine a real request. How many hold at once is
counted from the kernel's table of file locks (``/proc/locks``), and by a
shared counter, never from timings.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from astralvessel.errors import BackendUnavailableError, UsageError
from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.docker._gate import SCOPE_ENV, GatedApi, Gates, resolve_scope
from astralvessel.sandbox.docker._slots import Bound, engine_key, slot_folder

from .conftest import BASE_IMAGE

_SPAWN = multiprocessing.get_context("spawn")


def _held_slot_files(folder: str) -> int:
    """How many of ``folder``'s slot files the kernel says are flock-held right now."""
    # The kernel names a file as MAJOR:MINOR:INODE (device numbers in hex): an inode alone
    # can be another file system's, such as a container's.
    files = set()
    for path in Path(folder).glob("slot-*.lock"):
        info = os.stat(path)
        files.add(f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}")
    held = 0
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue  # a waiter, or not a whole-file lock
        held += fields[5] in files
    return held


def _worker(
    folder: str | None,
    size: int,
    threads: int,
    rounds: int,
    shared: tuple[Any, Any, Any, Any],
) -> None:
    """One host process: ``threads`` threads each hold a place ``rounds`` times, meeting inside."""
    meet, inside, most, seen_in_files = shared
    import docker

    client = docker.from_env(version="auto")
    api = GatedApi(client.api, Gates(size, folder))

    def one() -> None:
        for _ in range(rounds):
            slot = api.runc_slot(time.monotonic() + 120)
            try:
                with inside.get_lock():
                    inside.value += 1
                    most.value = max(most.value, inside.value)
                api.ungated.version()  # a real engine request, made while holding the place
                meet.wait()  # all of one generation hold at once here
                if folder is not None:
                    counted = _held_slot_files(folder)
                    with seen_in_files.get_lock():
                        seen_in_files.value = max(seen_in_files.value, counted)
                meet.wait()  # none leaves before every one of them has counted
                with inside.get_lock():
                    inside.value -= 1
            finally:
                slot.release()

    pool = [threading.Thread(target=one) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    client.close()


def _run_workers(
    folder: str | None, *, processes: int, size: int, threads: int, rounds: int, parties: int
) -> tuple[int, int]:
    """Run the workers to the end; the most holders at once by counter and by lock files."""
    meet = _SPAWN.Barrier(parties, timeout=120)
    inside = _SPAWN.Value("i", 0)
    most = _SPAWN.Value("i", 0)
    seen = _SPAWN.Value("i", 0)
    workers = [
        _SPAWN.Process(
            target=_worker, args=(folder, size, threads, rounds, (meet, inside, most, seen))
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(300)
    assert [w.exitcode for w in workers] == [0] * processes
    return most.value, seen.value


@pytest.mark.timeout(600)
def test_host_processes_sharing_the_folder_never_exceed_the_bound(
    docker_api: object, tmp_path: Path
) -> None:
    """Four processes of two threads, bound 2 shared: exactly 2 hold at once, counted in the files."""
    folder = str(tmp_path / "slots")
    os.mkdir(folder, 0o700)
    # 4 x 2 threads x 3 rounds = 24 holds, met in pairs: a broken barrier fails a worker.
    most, in_files = _run_workers(folder, processes=4, size=2, threads=2, rounds=3, parties=2)
    assert most == 2
    assert in_files == 2


@pytest.mark.timeout(600)
def test_a_bound_per_process_lets_each_process_its_own_size(docker_api: object) -> None:
    """The same four processes with a bound of 2 each but no shared folder: 8 hold at once."""
    most, _ = _run_workers(None, processes=4, size=2, threads=2, rounds=1, parties=8)
    assert most == 8


def _hold_every_slot(folder: str, size: int, ready: Any) -> None:
    """Hold every place of the bound, say so, and wait to be killed."""
    bound = Bound(size, folder)
    slots = [bound.acquire() for _ in range(size)]
    ready.set()
    time.sleep(600)
    del slots


def test_a_killed_holder_gives_its_places_back(tmp_path: Path) -> None:
    """A process SIGKILLed while holding every place: the kernel drops its locks, another takes them."""
    folder = str(tmp_path)
    ready = _SPAWN.Event()
    holder = _SPAWN.Process(target=_hold_every_slot, args=(folder, 3, ready))
    holder.start()
    assert holder.pid is not None
    try:
        assert ready.wait(120)
        bound = Bound(3, folder)
        with pytest.raises(TimeoutError, match="held by other host processes"):
            bound.acquire(time.monotonic() + 0.3)
        assert _held_slot_files(folder) == 3
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(60)
    slots = [bound.acquire(time.monotonic() + 60) for _ in range(3)]
    assert sorted(s.index or 0 for s in slots) == [0, 1, 2]
    for slot in slots:
        slot.release()
        slot.release()  # a second release gives back nothing more
    assert _held_slot_files(folder) == 0


# Python 3.12+ warns of forking a process with threads: this child only locks a file and exits.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_child_does_not_inherit_its_parents_places(tmp_path: Path) -> None:
    """A fork shares its parent's open lock files: the child must lock files of its own."""
    bound = Bound(1, str(tmp_path))
    slot = bound.acquire()
    try:
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            try:
                bound._local.release()  # the parent's thread holds the in-process place
                bound.acquire(time.monotonic() + 0.3)
                os.write(write, b"took it")
            except TimeoutError:
                os.write(write, b"waited")
            os._exit(0)
        os.close(write)
        answer = os.read(read, 64)
        os.waitpid(child, 0)
        os.close(read)
    finally:
        slot.release()
    assert answer == b"waited"


def test_the_folder_is_this_users_alone(tmp_path: Path) -> None:
    """The slot folder is made 0700 under engines/, keyed by the engine's address."""
    folder = slot_folder(str(tmp_path), "unix:///var/run/docker.sock")
    assert Path(folder).parent == tmp_path / "engines"
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    assert engine_key("") == engine_key("unix:///var/run/docker.sock")
    assert engine_key("tcp://10.0.0.1:2376") != engine_key("tcp://10.0.0.2:2376")


@pytest.mark.parametrize("attack", ["writable", "link", "foreign"])
def test_a_folder_others_could_hold_is_refused(tmp_path: Path, attack: str) -> None:
    """A world-writable folder, a link, or another user's: one clear error naming the opt-out."""
    runtime = tmp_path / "run"
    engines = runtime / "engines"
    engines.mkdir(parents=True)
    target = engines / engine_key("unix:///var/run/docker.sock")
    if attack == "writable":
        target.mkdir()
        target.chmod(0o777)
    elif attack == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.mkdir(mode=0o700)
        os.chown(target, 65534, 65534)
    with pytest.raises(BackendUnavailableError, match="engine_scope='process'"):
        slot_folder(str(runtime), "unix:///var/run/docker.sock")


def test_the_scope_comes_from_the_argument_the_environment_or_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """engine_scope wins over $ASTRALVESSEL_DOCKER_SCOPE, which wins over 'machine'."""
    monkeypatch.delenv(SCOPE_ENV, raising=False)
    assert resolve_scope(None) == "machine"
    monkeypatch.setenv(SCOPE_ENV, "process")
    assert resolve_scope(None) == "process"
    assert resolve_scope("machine") == "machine"


@pytest.mark.parametrize("value", ["host", "", "MACHINE", 1, True])
def test_a_scope_that_is_not_one_is_refused(value: object) -> None:
    """Anything but 'machine' or 'process' is a UsageError naming the setting."""
    with pytest.raises(UsageError, match="engine_scope"):
        resolve_scope(value)  # type: ignore[arg-type]


def test_backends_choose_a_shared_or_an_own_bound(docker_api: object) -> None:
    """By default a backend's runc bound lives in lock files; engine_scope='process' keeps it here."""
    shared = Docker(base_image=BASE_IMAGE, pull=False, engine_concurrency=6)
    own = Docker(base_image=BASE_IMAGE, pull=False, engine_concurrency=6, engine_scope="process")
    assert shared.engine._gate.runc.shared
    assert not own.engine._gate.runc.shared
    assert shared.engine._gate is not own.engine._gate
    shared.engine.api().runc_slot().release()  # the first place taken makes the folder
    folder = shared.engine._gate.runc.folder
    assert folder is not None
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700


def test_an_unusable_folder_fails_the_first_request_not_the_backend(tmp_path: Path) -> None:
    """A bound whose folder cannot be used is made without error; taking a place names the folder."""
    runtime = tmp_path / "run"
    runtime.mkdir()
    runtime.chmod(0o777)  # anyone could swap what is inside
    bound = Bound(2, lambda: slot_folder(str(runtime), "unix:///var/run/docker.sock"))
    with pytest.raises(BackendUnavailableError, match=re.escape(str(runtime))):
        bound.acquire()
    assert _every_local_place_free(bound)


def _every_local_place_free(bound: Bound) -> bool:
    """Whether the bound's in-process places all came back after a failed take."""
    taken = [bound._local.acquire(blocking=False) for _ in range(bound.size)]
    for took in taken:
        if took:
            bound._local.release()
    return all(taken)

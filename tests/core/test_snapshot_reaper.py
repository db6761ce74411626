"""The reaper never stalls: busy folders wait their turn again, failures are logged, and a
process with no thread to start (at shutdown) removes its trees itself, silently.

``_reaper`` removes dropped snapshot trees on one daemon thread through
``_ground/_removal`` (``remove_once``, ``remove_folder``), which follows no link.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import astralvessel
from astralvessel._executor._snapshot import _reaper
from astralvessel._executor._snapshot._reaper import drain, enqueue
from astralvessel._executor._snapshot._store import new_folder
from astralvessel._ground import _removal
from astralvessel._ground._removal import remove_folder, remove_once


def _busy_until(
    monkeypatch: pytest.MonkeyPatch, folder: Path, free: threading.Event, tries: list[str]
) -> None:
    """``folder`` busy (EBUSY, as a lazy unmount leaves it) until ``free`` is set; each
    removal of any folder is recorded in ``tries`` as the folder's name."""
    real_rmdir = os.rmdir

    def rmdir(path: Any, *args: Any, **kwargs: Any) -> None:
        tries.append(os.path.basename(os.fsdecode(path)))
        if os.fspath(path) == os.fspath(folder) and not free.is_set():
            raise OSError(errno.EBUSY, "Device or resource busy", os.fspath(path))
        real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir)


def _wait_for(check: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_remove_once_says_whether_a_busy_folder_is_worth_another_try(
    monkeypatch: pytest.MonkeyPatch,
):
    """One attempt: False while the folder is busy, True once it is gone."""
    folder = new_folder()
    (folder / "f").write_bytes(b"x")
    free = threading.Event()
    _busy_until(monkeypatch, folder, free, [])
    assert remove_once(folder) is False
    assert folder.exists()
    free.set()
    assert remove_once(folder) is True
    assert not folder.exists()


def test_a_busy_folder_does_not_hold_up_the_folders_queued_behind_it(
    monkeypatch: pytest.MonkeyPatch,
):
    """The reaper tries a busy folder once, removes the next one, then comes back to it."""
    busy, after = new_folder(), new_folder()
    free = threading.Event()
    tries: list[str] = []
    _busy_until(monkeypatch, busy, free, tries)
    enqueue(busy)
    enqueue(after)
    assert _wait_for(lambda: not after.exists())
    # Tried once before the next folder went, not again and again for BUSY_SECONDS.
    assert tries[: tries.index(after.name)].count(busy.name) == 1
    assert busy.exists()
    free.set()
    assert drain(30)
    assert not busy.exists()


def test_a_folder_busy_for_good_is_left_and_the_queue_goes_on(monkeypatch: pytest.MonkeyPatch):
    """Past BUSY_SECONDS a busy folder is left (the next host's sweep finds it); drain ends."""
    monkeypatch.setattr(_reaper, "BUSY_SECONDS", 0.3)
    busy = new_folder()
    free = threading.Event()
    _busy_until(monkeypatch, busy, free, [])
    enqueue(busy)
    assert drain(30)
    assert busy.exists()
    monkeypatch.undo()
    remove_folder(busy)


def test_a_removal_that_raises_is_logged_and_the_reaper_goes_on(
    caplog: pytest.LogCaptureFixture,
):
    """A job whose callback raises is logged as snapshot.removal_failed (its folder still
    goes), and the same thread removes the next folder."""
    first, second = new_folder(), new_folder()

    def broken() -> None:
        raise ValueError("a broken release")

    seen: list[threading.Thread] = []
    with caplog.at_level(logging.WARNING, logger="astralvessel.snapshots"):
        enqueue(first, broken)
        enqueue(second, lambda: seen.append(threading.current_thread()))
        assert drain(30)
    assert not first.exists()
    assert not second.exists()
    (record,) = [r for r in caplog.records if r.name == "astralvessel.snapshots"]
    assert record.levelno == logging.WARNING
    fields = record.astralvessel  # type: ignore[attr-defined]
    assert fields["event"] == "snapshot.removal_failed"
    assert fields["folder"] == str(first)
    assert fields["error"] == "ValueError: a broken release"
    assert seen == [_reaper._reaper.thread]


@pytest.fixture
def no_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh reaper in a process where no thread can start (as at interpreter shutdown,
    or past a thread limit): Python raises RuntimeError from ``Thread.start``."""

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread")

    monkeypatch.setattr(_reaper, "_reaper", _reaper._Reaper())
    monkeypatch.setattr(threading.Thread, "start", refuse)
    yield
    monkeypatch.undo()


@pytest.mark.usefixtures("no_threads")
def test_without_a_thread_the_caller_removes_the_folder():
    """With no thread to start, the folder goes on the caller's thread, callback first;
    nothing is left queued for a thread that never comes."""
    folder = new_folder()
    (folder / "f").write_bytes(b"x")
    called: list[threading.Thread] = []
    enqueue(folder, lambda: called.append(threading.current_thread()))
    assert not folder.exists()
    assert called == [threading.current_thread()]
    assert _reaper._reaper.thread is None
    assert drain(0)


#: Interpreters to exit with: this one, and each newer one pyenv has (3.12 printed a
#: traceback at exit: a finalizer's thread could not start at interpreter shutdown).
def _newer_pythons() -> list[str]:
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    try:  # another user's pyenv may not be readable: then this interpreter alone
        return sorted(str(p) for p in pyenv.glob("versions/3.1[2-9]*/bin/python"))
    except OSError:
        return []


_PYTHONS = [sys.executable, *_newer_pythons()]
#: The package and attrs, found where this interpreter found them (both pure Python).
_PATH = os.pathsep.join(
    str(Path(module.__file__ or "").parent.parent) for module in (astralvessel, attrs)
)
#: Takes a snapshot (the capture plan answered as a sandbox would), drops one or keeps it
#: until exit, and prints the trees' folders.
_TAKE = """
import json, sys
from astralvessel._executor._snapshot._capture import capture
from astralvessel._executor._snapshot._store import Budget
from astralvessel.sandbox import FsReply

def take(budget):
    plan = capture(timeout=5.0, max_bytes=1 << 20, max_files=10, budget=budget)
    next(plan)
    listing = [{"name": "f", "kind": "file", "mode": 0o644, "size": 2, "target": None}]
    reply = FsReply(data=json.dumps(listing).encode())
    while True:
        try:
            plan.send(reply)
        except StopIteration as done:
            return done.value
        reply = FsReply(data=b"hi")

budget = Budget(1 << 20)
kept = take(budget)
print(kept.path.parent)
if sys.argv[1] == "drop":
    dropped = take(budget)
    print(dropped.path.parent)
    del dropped
"""


@pytest.mark.parametrize("python", _PYTHONS)
@pytest.mark.parametrize("what", ["keep", "drop"])
def test_a_process_exits_silently_with_its_trees_removed(python: str, what: str):
    """A process that took snapshots exits with nothing on stderr and no tree left, a tree
    still alive at exit (its finalizer runs at shutdown, when no thread can start) too."""
    env = {**os.environ, "PYTHONPATH": _PATH}
    done = subprocess.run(
        [python, "-c", _TAKE, what],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert (done.returncode, done.stderr) == (0, "")
    folders = [Path(line) for line in done.stdout.split()]
    assert len(folders) == (2 if what == "drop" else 1)
    assert not any(folder.exists() for folder in folders)


def test_a_link_in_a_tree_never_changes_the_host_file_it_names(tmp_path: Path):
    """A tree's folders without write bits get theirs back, but a link among them to a host
    file (mode 0600) or a host folder (mode 0500) changes neither: both stay as they were."""
    host_file = tmp_path / "secret"
    host_file.write_bytes(b"host")
    host_file.chmod(0o600)
    host_folder = tmp_path / "private"
    host_folder.mkdir(mode=0o500)
    folder = new_folder()
    tree = folder / "tree"
    (tree / "ro").mkdir(parents=True)
    for name, target in (("to-file", host_file), ("to-folder", host_folder)):
        os.symlink(target, tree / "ro" / name)
        os.symlink(target, tree / name)
    os.chmod(tree / "ro", 0o555)  # noqa: S103 - a sandbox's read-only folder, as kept
    os.chmod(tree, 0o555)  # noqa: S103
    # What the removal does as an ordinary user meeting those folders (root needs no bits,
    # so as root the removal never does it): here whoever runs the test.
    _removal._make_writable(folder)
    assert (tree / "ro").stat().st_mode & 0o700 == 0o700
    enqueue(folder)
    assert drain(30)
    assert not folder.exists()
    assert host_file.read_bytes() == b"host"
    assert host_file.stat().st_mode & 0o7777 == 0o600
    assert host_folder.is_dir()
    assert host_folder.stat().st_mode & 0o7777 == 0o500


def test_a_tree_nested_as_deep_as_a_name_goes_is_removed(caplog: pytest.LogCaptureFixture):
    """A tree 2000 folders deep (a 4000-byte name, which a manifest takes) is removed whole,
    past rmtree's recursion and PATH_MAX, and nothing is logged as failed."""
    folder = new_folder()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(2000):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    with caplog.at_level(logging.WARNING, logger="astralvessel.snapshots"):
        enqueue(folder)
        assert drain(60)
    assert not folder.exists()
    assert not [r for r in caplog.records if r.name == "astralvessel.snapshots"]

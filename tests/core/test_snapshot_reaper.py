"""The reaper never stalls: busy folders wait their turn again, failures are logged, and a
process with no thread to start (at shutdown) removes its trees itself, silently.

``_reaper`` removes dropped snapshot trees on one daemon thread through
``_ground/_removal`` (``remove_once``, ``remove_folder``), which follows no link.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from astralvessel._executor._snapshot._reaper import drain, enqueue
from astralvessel._executor._snapshot._store import new_folder
from astralvessel._ground import _removal
from astralvessel._ground._removal import remove_once


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

"""A fresh turn's ``fork(n)`` freezes its workspace in place, as root and as an ordinary
user, on bubblewrap and nsjail: nothing is copied to the store, and the forks open on the
frozen layer copy-on-write (``nox -s unprivileged`` runs this as an ordinary user).

As root the host stages the layer at a path of its store and the forks bind it; as an
ordinary user the host keeps the layer's descriptor (the server's own ``fsmount`` tmpfs,
``server/_heldfs``) and each fork's launcher passes it to its server, which lays the
overlay on its own clone and closes the descriptor before any call. Real sandboxes, no
mocks: what a call sees, what the store holds, and what a hostile call cannot do.
"""

from __future__ import annotations

import gc
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astralvessel import Executor, Registry, TurnSnapshot
from astralvessel._executor._snapshot._reaper import drain
from astralvessel._executor._snapshot._store import store_root
from astralvessel._executor._snapshot._tree import scan_tree

from .conftest import ROOMY
from .frozen import closed

ROOT = os.geteuid() == 0
#: 64 files of 16 KiB, folders and a link: a store copy of them would show at once.
_MAKE = (
    "cd /workspace && mkdir -p d/e && for i in $(seq 64); do head -c 16384 /dev/urandom "
    "> d/f$i; done && echo parent > shared && ln -s shared link && echo deep > d/e/g"
)


def _sh(turn: Any, script: str) -> str:
    result = turn.exec(["/bin/sh", "-c", script])
    assert result.returncode == 0, result.stderr
    return str(result.stdout.decode("utf-8", "surrogateescape"))


def _store_bytes() -> int:
    """The bytes of the regular files in the store's own folders (a staged layer's mount,
    another filesystem, not counted: it is the sandbox's tmpfs, not a copy)."""
    root = store_root()
    device = os.stat(root).st_dev
    total = 0
    for folder, names, files in os.walk(root):
        names[:] = [n for n in names if os.lstat(os.path.join(folder, n)).st_dev == device]
        for name in files:
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(info.st_mode):
                total += info.st_blocks * 512
    return total


def _unchanged(snapshot: TurnSnapshot) -> bool:
    """Whether the snapshot's tree holds exactly its manifest's bytes: its saved form
    (read from the tree by name, as the host reads a held layer through /proc/self/fd)
    loads, every digest checked."""
    saved = io.BytesIO()
    snapshot.save(saved)
    return TurnSnapshot.load(io.BytesIO(saved.getvalue())) == snapshot


@pytest.fixture(params=["bubblewrap", "nsjail"])
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    with Executor(Registry(), sandbox=request.param) as executor:
        yield executor


def _frozen_fork(executor: Executor, n: int) -> tuple[Any, list[Any], TurnSnapshot]:
    """A fresh turn with ``_MAKE``'s files, forked ``n`` times: the parent (open), its
    forks and the snapshot they opened from, checked to be a frozen layer, not a copy."""
    parent = executor.turn()
    _sh(parent, _MAKE)
    before = _store_bytes()
    forks = parent.fork(n)
    source = forks[0].snapshot_source
    assert source is not None
    assert source.layer is not None, "the fork was copied, not frozen"
    if ROOT:
        assert source.held_layer is None
        assert os.path.ismount(source.path)
    else:
        held = source.held_layer
        assert held is not None
        assert source.path == Path(f"/proc/self/fd/{held}")
    assert _store_bytes() - before < 64 << 10, "the fork copied the workspace to the store"
    return parent, forks, source


def test_forks_see_the_parents_files_and_write_apart(executor: Executor) -> None:
    parent, forks, source = _frozen_fork(executor, 2)
    with parent, forks[0] as first, forks[1] as second:
        listing = "cd /workspace && ls d | wc -l && cat shared link d/e/g"
        assert _sh(first, listing) == "65\nparent\nparent\ndeep\n"
        _sh(first, "cd /workspace && echo first > shared && rm d/f1 && echo new > mine")
        assert _sh(second, listing) == "65\nparent\nparent\ndeep\n"
        assert _sh(second, "ls /workspace") == "d\nlink\noutbox\nshared\n"
        # The parent writes on, above the layer; no fork sees it, nor it theirs.
        _sh(parent, "cd /workspace && echo later >> shared && echo p > own")
        assert _sh(parent, "cat /workspace/shared; ls /workspace") == (
            "parent\nlater\nd\nlink\noutbox\nown\nshared\n"
        )
        assert _sh(first, "cat /workspace/shared; ls /workspace") == (
            "first\nd\nlink\nmine\noutbox\nshared\n"
        )
        assert (source.path / "shared").read_bytes() == b"parent\n"
        assert _unchanged(source)


def test_a_forks_snapshot_and_the_layers_save_and_load(executor: Executor) -> None:
    parent, forks, source = _frozen_fork(executor, 1)
    with parent, forks[0] as fork:
        _sh(fork, "cd /workspace && echo fork > shared && rm d/f2")
        taken = fork.snapshot()
    assert (taken.path / "shared").read_bytes() == b"fork\n"
    assert not (taken.path / "d/f2").exists()
    assert (taken.path / "d/f3").read_bytes() == (source.path / "d/f3").read_bytes()
    assert scan_tree(taken.path, **ROOMY).content_id == taken.content_id
    for snapshot in (source, taken):
        saved = io.BytesIO()
        snapshot.save(saved)
        loaded = TurnSnapshot.load(io.BytesIO(saved.getvalue()))
        assert loaded == snapshot
        with executor.turn(snapshot=loaded) as again:
            assert _sh(again, "cat /workspace/shared") == (snapshot.path / "shared").read_text()


def test_a_fork_cannot_change_the_frozen_layer(executor: Executor) -> None:
    """A hostile call in a fork writes, chmods, removes and remounts what it can reach of
    the layer: only its own upper layer changes; and it holds no descriptor of the layer."""
    parent, forks, source = _frozen_fork(executor, 2)
    with parent, forks[0] as hostile, forks[1] as sibling:
        attack = (
            "cd /workspace; echo bad > d/f5; chmod 000 d/f6; rm -rf d/e; "
            "touch .vessel-layers/held/x .vessel-layers/x; "
            "mount -o remount,rw /workspace/.vessel-layers/held; mount -o remount,rw /; "
            "unshare -rm sh -c 'mount -o remount,rw /workspace/.vessel-layers/held; "
            "umount -l /workspace && echo bad > /workspace/.vessel-layers/held/f7'; "
            "cat /workspace/d/f5; true"
        )
        assert _sh(hostile, attack + " 2>/dev/null") == "bad\n"
        listed = _sh(hostile, "ls -l /proc/[0-9]*/fd/ 2>/dev/null; true").splitlines()
        held = [line.split(" -> ")[1] for line in listed if " -> " in line]
        assert all(target.startswith(("pipe:", "/proc/", "/dev/")) for target in held), held
        mode = "cd /workspace && ls -l d/f6 | cut -c1-10 && cat d/e/g"
        assert _sh(sibling, mode) == _sh(parent, mode) != "----------\ndeep\n"
        assert _sh(parent, "cd /workspace && ls -A") == "d\nlink\noutbox\nshared\n"
    assert _unchanged(source)
    assert os.statvfs(source.path).f_flag & os.ST_RDONLY


def test_the_layer_goes_with_its_last_snapshot(executor: Executor) -> None:
    """Held: its descriptor is closed; staged: unmounted. Not before the forks are gone."""
    parent, forks, source = _frozen_fork(executor, 1)
    held, path, device = source.held_layer, source.path, os.stat(source.path).st_dev
    with parent, forks[0] as fork:
        assert _sh(fork, "cat /workspace/d/e/g") == "deep\n"
    del parent, forks, fork, source
    gc.collect()
    assert drain(10)
    if held is None:
        assert not os.path.ismount(path)
    else:
        assert closed(held, device)


def test_a_fork_that_cannot_freeze_copies_and_says_why(
    executor: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    """A detached process running keeps the workspace as it was: the fork copies the
    files instead (the parent and the process go on), and the log says why."""
    with executor.turn() as parent:
        _sh(parent, _MAKE)
        process = parent.start(["sh", "-c", "sleep 30"])
        with caplog.at_level("INFO", logger="astralvessel.snapshots"):
            (fork,) = parent.fork(1)
        with fork:
            source = fork.snapshot_source
            assert source is not None
            assert source.layer is None
            assert _sh(fork, "cat /workspace/shared") == _sh(parent, "cat /workspace/shared")
        refused = [r for r in caplog.records if "snapshot.freeze_refused" in r.getMessage()]
        assert len(refused) == 1, caplog.text
        fields = refused[0].astralvessel  # type: ignore[attr-defined]
        assert fields["errno"] == "EBUSY"
        assert fields["backend"] == executor.sandbox.name
        _sh(parent, "echo later > /workspace/later")
        process.kill()

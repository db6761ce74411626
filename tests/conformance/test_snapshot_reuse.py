"""Incremental snapshots on the real sandboxes: what is linked is certain, what changed is read.

A snapshot links each file the store holds already (unchanged since the turn's
last capture, or still the lower layer's of the snapshot a copy-on-write turn
opened from) and reads the rest. Each test changes files the ways that could
fool a reuse rule (rewritten in place with its mtime set back, replaced by a
rename or a hard link of the same size, changed within the capture's clock
tick, whited out, a folder made opaque) and checks the new snapshot holds
exactly what the sandbox shows: a turn opened from it lists the same names,
modes and bytes, and the tree on the host hashes to the snapshot's content id.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from astralvessel import Executor, Turn, TurnSnapshot
from astralvessel._executor._snapshot._mechanism import upper_layer_listed
from astralvessel._executor._snapshot._tree import scan_tree

from .calls import run_script

#: Every name under the workspace (the outbox aside) with its kind, mode, size and link
#: target (a folder's size is its filesystem's), then each regular file's checksum. Not
#: the link count: a file several snapshots share is one inode on the host, whose links
#: a copy-on-write turn sees.
_LISTING = (
    "cd /workspace && find . -path ./outbox -prune -o -mindepth 1 "
    "\\( -type d -printf '%P|%y|%m\\n' -o -printf '%P|%y|%m|%s|%l\\n' \\) | LC_ALL=C sort "
    "&& find . -path ./outbox -prune -o -type f -exec md5sum {} + | LC_ALL=C sort"
)
#: Ten files of one size in two folders, made long enough before the first capture.
_MAKE = (
    "cd /workspace && mkdir -p d e && for i in 0 1 2 3 4; do printf file-$i > d/$i; "
    "printf file-e$i > e/$i; done && printf base > keep"
)
#: What a turn does between two snapshots that a reuse rule could miss: each changed file
#: keeps its size and gets its old mtime back.
_FOOL = (
    "cd /workspace && "
    "printf 'FILE-0' > d/0 && touch -r keep d/0 && "  # rewritten in place
    "cp -p d/2 d/1.new && mv d/1.new d/1 && "  # replaced by a rename (d/2's bytes)
    "ln -f d/3 d/4 && "  # replaced by a hard link of another
    "chmod 600 e/0 && "  # a mode alone
    "rm -r e/1 && "  # gone
    "rm -r e && mkdir e && printf 'FILE-e2' > e/2 && touch -r keep e/2"  # a folder made anew
)


def _inode(snapshot: TurnSnapshot | Path, name: str) -> int:
    base = snapshot if isinstance(snapshot, Path) else snapshot.path
    return os.stat(base / name).st_ino


def _holds_what_it_shows(executor: Executor, turn: Turn, snapshot: TurnSnapshot) -> None:
    """The snapshot's tree hashes to its id, and a turn opened from it lists as ``turn``."""
    bounds = {"max_bytes": 1 << 30, "max_files": 1000}
    assert scan_tree(snapshot.path, **bounds).content_id == snapshot.content_id
    with executor.turn(snapshot=snapshot) as opened:
        assert run_script(opened, _LISTING) == run_script(turn, _LISTING)


def test_a_second_snapshot_links_what_did_not_change(executor: Executor):
    """Files unchanged since the last snapshot are the store's own (one inode), and the
    incremental snapshot's id is the full one's: same files, same id."""
    with executor.turn() as turn:
        run_script(turn, _MAKE)
        time.sleep(0.3)  # past the capture's racy window: the files are recorded
        first = turn.snapshot()
        second = turn.snapshot()
        assert second == first
        assert second.path != first.path
        assert _inode(second, "d/0") == _inode(first, "d/0")
        _holds_what_it_shows(executor, turn, second)


def test_a_file_changed_between_two_snapshots_is_read_again(executor: Executor):
    """Rewritten with its mtime set back, replaced by a rename or a hard link, chmodded,
    removed, its folder made anew: the next snapshot holds what the turn shows."""
    with executor.turn() as turn:
        run_script(turn, _MAKE)
        time.sleep(0.3)
        first = turn.snapshot()
        run_script(turn, _FOOL)
        second = turn.snapshot()
        assert (second.path / "d/0").read_bytes() == b"FILE-0"
        assert (second.path / "d/1").read_bytes() == b"file-2"
        assert _inode(second, "d/3") == _inode(second, "d/4")
        assert _inode(second, "keep") == _inode(first, "keep")
        _holds_what_it_shows(executor, turn, second)


def test_a_file_changed_in_the_captures_tick_is_read_again(executor: Executor):
    """A file written just before a snapshot and rewritten just after, same size and
    mtime, may share the capture's clock tick: it is never taken as unchanged."""
    with executor.turn() as turn:
        for round_ in range(3):
            run_script(turn, f"cd /workspace && printf 'r{round_}' > f && touch -d @1 f")
            turn.snapshot()
            run_script(turn, f"cd /workspace && printf 'R{round_}' > f && touch -d @1 f")
            again = turn.snapshot()
            assert (again.path / "f").read_bytes() == f"R{round_}".encode()


def test_a_forks_snapshot_links_only_what_it_did_not_change(executor: Executor):
    """A fork's snapshot links the files its upper layer does not hold, and reads every
    file it changed, whited out or hid under an opaque folder."""
    with executor.turn() as parent:
        run_script(parent, _MAKE)
        (fork,) = parent.fork(1)
    source = fork.snapshot_source
    assert source is not None
    with fork:
        run_script(fork, _FOOL)
        taken = fork.snapshot()
        assert (taken.path / "d/0").read_bytes() == b"FILE-0"
        assert (taken.path / "d/1").read_bytes() == b"file-2"
        assert (taken.path / "e/2").read_bytes() == b"FILE-e2"
        assert sorted(os.listdir(taken.path / "e")) == ["2"]
        if upper_layer_listed(executor.sandbox.name):
            linked = _linked_from(source)
            assert _inode(taken, "keep") == _inode(linked, "keep")
            assert _inode(taken, "d/2") == _inode(linked, "d/2")
        _holds_what_it_shows(executor, fork, taken)


def _linked_from(source: TurnSnapshot) -> TurnSnapshot | Path:
    """Where a snapshot over ``source`` links its unchanged files from: its tree, or for
    a frozen layer (a fresh turn's fork as root, bubblewrap and nsjail), the layer's copy
    in the store (another filesystem's files cannot be hard-linked)."""
    layer = source.layer
    if layer is None:
        return source
    assert layer.copy is not None
    return layer.copy.path


def test_the_snapshots_of_a_fresh_turns_forks_link_the_same_files(executor: Executor) -> None:
    """A fresh turn's forks (its workspace frozen in place, where the backend does) each
    snapshot: every unchanged file is one inode in all their trees, as when they opened
    from a tree in the store: the whole workspace is copied once at most, not per fork."""
    with executor.turn() as parent:
        run_script(parent, _MAKE)
        forks = parent.fork(3)
    source = forks[0].snapshot_source
    assert source is not None
    taken = []
    for index, fork in enumerate(forks):
        assert fork.snapshot_source is source
        with fork:
            run_script(fork, f"cd /workspace && printf fork-{index} > d/0 && printf x > new")
            taken.append(fork.snapshot())
            _holds_what_it_shows(executor, fork, taken[-1])
    for index, snapshot in enumerate(taken):
        assert (snapshot.path / "d/0").read_bytes() == f"fork-{index}".encode()
    if upper_layer_listed(executor.sandbox.name):
        for name in ("keep", "d/1", "e/4"):
            assert len({_inode(snapshot, name) for snapshot in taken}) == 1, name
            assert _inode(taken[0], name) == _inode(_linked_from(source), name)
        assert len({_inode(snapshot, "d/0") for snapshot in taken}) == 3


def test_a_fork_of_a_linked_snapshot_changes_no_tree(executor: Executor):
    """Trees share inodes: a fork writing, chmodding and removing a shared file changes
    neither the snapshot it opened from nor the older one whose inode it is."""
    with executor.turn() as turn:
        run_script(turn, _MAKE)
        time.sleep(0.3)
        first = turn.snapshot()
        run_script(turn, "printf new > /workspace/new")
        second = turn.snapshot()
    assert _inode(second, "keep") == _inode(first, "keep")
    bounds = {"max_bytes": 1 << 30, "max_files": 1000}
    with executor.turn(snapshot=second) as fork:
        run_script(
            fork,
            "cd /workspace && echo more >> keep && chmod 600 d/0 && rm d/2 && "
            "{ echo bad > /.vessel-lower/keep; true; } 2>/dev/null",
        )
        assert run_script(fork, "cat /workspace/keep") == "basemore\n"
    for snapshot in (first, second):
        assert scan_tree(snapshot.path, **bounds).content_id == snapshot.content_id
    assert (first.path / "keep").read_bytes() == b"base"


def test_a_fresh_turns_snapshot_after_its_fork_links_what_it_did_not_change(
    executor: Executor,
) -> None:
    """The parent writes on after its fork (above a frozen layer, where the backend
    freezes): its next snapshot links every file it did not change, as a fork's does,
    and reads what it changed."""
    with executor.turn() as parent:
        run_script(parent, _MAKE)
        (fork,) = parent.fork(1)
        fork.close()
        source = fork.snapshot_source
        assert source is not None
        run_script(parent, "cd /workspace && printf FILE-0 > d/0")
        taken = parent.snapshot()
        assert (taken.path / "d/0").read_bytes() == b"FILE-0"
        if source.layer is not None and upper_layer_listed(executor.sandbox.name):
            linked = _linked_from(source)
            assert _inode(taken, "keep") == _inode(linked, "keep")
            assert _inode(taken, "d/1") == _inode(linked, "d/1")
            assert _inode(taken, "d/0") != _inode(linked, "d/0")
        _holds_what_it_shows(executor, parent, taken)
        run_script(parent, _FOOL)
        again = parent.snapshot()
        assert (again.path / "d/1").read_bytes() == b"file-2"
        assert (again.path / "e/2").read_bytes() == b"FILE-e2"
        assert sorted(os.listdir(again.path / "e")) == ["2"]
        _holds_what_it_shows(executor, parent, again)

"""A frozen layer's snapshot: a workspace tmpfs made read-only in place, staged in the store.

Each layer is real (``frozen.py``: a tmpfs made with the new mount API, filled,
cloned and made read-only, as a sandbox's server hands one to the host), and
each comparison is with the existing way: a capture from a real bubblewrap turn
whose calls made the same files. Root only (a tmpfs of one's own needs
``CAP_SYS_ADMIN``).
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import os
import socket
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from astralvessel import Executor, Registry, SnapshotError, TurnSnapshot
from astralvessel._executor._snapshot._build import TreeWriter
from astralvessel._executor._snapshot._capture import capture
from astralvessel._executor._snapshot._freeze import snapshot_frozen, store_copy
from astralvessel._executor._snapshot._reaper import drain
from astralvessel._executor._snapshot._reuse import Captures, Held, held_files
from astralvessel._executor._snapshot._store import Budget, Tree
from astralvessel.sandbox import FsReply, FsRequest

from .conftest import ROOMY, make_tree
from .frozen import freeze, frozen_layer, writable_tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a tmpfs of one's own needs root")

#: Folders, modes, a symlink in and one out, a hard link, an empty file, a name that is
#: not UTF-8, a sparse file and a folder without write bits: run in a turn's workspace and
#: in a layer alike (the conformance suite's tree).
_MAKE_TREE = (
    "umask 022 && mkdir -p a/b c && echo hi > a/b/f && ln a/b/f a/hard && "
    "ln -s ../c a/in && ln -s /etc/passwd a/out && : > empty && "
    "printf x > \"$(printf 'n\\377me')\" && chmod 750 a && chmod 600 a/b/f && "
    "truncate -s 3M sparse && printf y >> sparse && chmod 555 c"
)
#: Every name under the workspace (the outbox aside) with what a restore must keep.
_LISTING = (
    "cd /workspace && find . -path ./outbox -prune -o -mindepth 1 "
    "\\( -type d -printf '%P|%y|%m\\n' -o -printf '%P|%y|%m|%s|%l|%n\\n' \\) "
    "| LC_ALL=C sort | od -c "
    "&& find . -path ./outbox -prune -o -type f -exec md5sum {} + | LC_ALL=C sort"
)


def _layer_of_script(script: str) -> int:
    """A frozen layer whose files ``script`` made, run in the layer's root on the host."""
    mount = writable_tmpfs()
    try:
        subprocess.run(
            ["/bin/sh", "-c", script], cwd=f"/proc/self/fd/{mount}", check=True, pass_fds=(mount,)
        )
        return freeze(mount)
    finally:
        os.close(mount)


def _snapshot(
    fd: int,
    budget: Budget | None = None,
    *,
    max_bytes: int = ROOMY["max_bytes"],
    max_files: int = ROOMY["max_files"],
) -> TurnSnapshot:
    return snapshot_frozen(fd, budget=budget, max_bytes=max_bytes, max_files=max_files)


def _closed(fd: int, device: int) -> bool:
    """Whether ``fd`` no longer holds the layer of ``device`` (closed, or its number reused)."""
    try:
        return os.fstat(fd).st_dev != device
    except OSError:
        return True


def _mounted(device: int) -> list[str]:
    """Where the layer of ``device`` is mounted in this process's namespace."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            major, minor = (int(n) for n in fields[2].split(":"))
            if os.makedev(major, minor) == device:
                found.append(fields[4])
    return found


def _gone(fd: int, device: int) -> bool:
    """Whether the host holds the layer of ``device`` no more: its descriptor closed and
    no mount of it left (its staged folder unmounted)."""
    return _closed(fd, device) and not _mounted(device)


def _copy_of(layer: Tree) -> Tree | None:
    """The layer's store copy as it is now (a call, so a check before does not narrow it)."""
    return layer.copy


def _sh(turn: Any, script: str) -> str:
    result = turn.exec(["/bin/sh", "-c", script])
    assert result.returncode == 0, result.stderr
    return str(result.stdout.decode("utf-8", "surrogateescape"))


@pytest.fixture(scope="module")
def executor() -> Iterator[Executor]:
    with Executor(Registry(), sandbox="bubblewrap") as executor:
        yield executor


@pytest.fixture(scope="module")
def captured(executor: Executor) -> Iterator[tuple[TurnSnapshot, str]]:
    """The existing way: a real turn's calls make the tree, ``Turn.snapshot`` copies it;
    and the listing of that turn's workspace."""
    with executor.turn() as turn:
        _sh(turn, "cd /workspace && " + _MAKE_TREE)
        yield turn.snapshot(), _sh(turn, _LISTING)


def test_a_frozen_layer_is_the_same_snapshot_as_a_capture(
    captured: tuple[TurnSnapshot, str],
) -> None:
    """Same files, same manifest and content id: links, modes, sparse bytes, odd names."""
    snapshot = _snapshot(_layer_of_script(_MAKE_TREE), Budget(1 << 30))
    assert snapshot.manifest == captured[0].manifest
    assert snapshot.content_id == captured[0].content_id
    assert snapshot.layer is not None
    assert os.path.ismount(snapshot.path)  # staged in the store: a path, no descriptor
    assert captured[0].layer is None


def test_set_id_bits_are_dropped_with_a_captures_note() -> None:
    """A call cannot set them in a turn; a layer made by hand can, and loses them so."""
    snapshot = _snapshot(_layer_of_script("echo s > setid && chmod 4755 setid"))
    (entry,) = snapshot.manifest.entries
    assert entry.mode == 0o755
    assert snapshot.notes == ("set-id bits dropped from 'setid'",)


def test_a_frozen_layer_saves_the_bytes_a_capture_saves(
    captured: tuple[TurnSnapshot, str],
) -> None:
    """``save`` reads the layer as it reads a store tree: the same archive, loaded back equal."""
    snapshot = _snapshot(_layer_of_script(_MAKE_TREE))
    ours, theirs = io.BytesIO(), io.BytesIO()
    snapshot.save(ours)
    captured[0].save(theirs)
    assert ours.getvalue() == theirs.getvalue()
    loaded = TurnSnapshot.load(io.BytesIO(ours.getvalue()))
    assert loaded == snapshot
    assert loaded.manifest == snapshot.manifest


def test_a_turn_opens_from_a_frozen_layer_with_its_files(
    executor: Executor, captured: tuple[TurnSnapshot, str]
) -> None:
    """A real bubblewrap turn gets the layer's files, and its own snapshot is the layer's."""
    snapshot = _snapshot(_layer_of_script(_MAKE_TREE))
    with executor.turn(snapshot=snapshot) as turn:
        assert _sh(turn, _LISTING) == captured[1]
        assert turn.snapshot() == snapshot


@pytest.mark.parametrize("backend", ["bubblewrap", "nsjail"])
def test_a_turn_lays_its_overlay_on_the_staged_layer(backend: str, tmp_path: Path) -> None:
    """The launcher binds the staged layer by its path, as a store tree, and the server
    lays the workspace's overlay on it (its idmapped clone, made in the sandbox's own
    mount namespace); no call holds a descriptor of it. The turn's writes reach only its
    own layer, and its snapshot links the unchanged file from the layer's store copy."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "kept").write_bytes(b"kept\n")
    (tree / "changed").write_bytes(b"before\n")
    source = _snapshot(frozen_layer(tree), Budget(1 << 30))
    layer = os.stat(source.path).st_dev
    with Executor(Registry(), sandbox=backend) as executor, executor.turn(snapshot=source) as turn:
        mounts = _sh(turn, "cat /proc/self/mountinfo")
        assert " /workspace rw,nosuid,nodev,relatime - overlay " in mounts
        listed = _sh(turn, "ls -l /proc/self/fd").splitlines()
        held = [line.split(" -> ")[1] for line in listed if " -> " in line]
        assert all(target.startswith(("pipe:", "/proc/")) for target in held), held
        assert _sh(turn, "cd /workspace && echo after >> changed && cat kept changed") == (
            "kept\nbefore\nafter\n"
        )
        later = turn.snapshot()
    assert (later.path / "changed").read_bytes() == b"before\nafter\n"
    assert os.stat(later.path / "kept").st_dev != layer
    copy = source.layer.copy if source.layer is not None else None
    assert copy is not None
    assert os.stat(later.path / "kept").st_ino == os.stat(copy.path / "kept").st_ino
    assert (source.path / "changed").read_bytes() == b"before\n"
    assert later != source


def test_a_dropped_snapshot_unmounts_the_layer_and_gives_its_bytes_back(tmp_path: Path) -> None:
    """The layer counts on the budget (each inode once) while a snapshot refers to it; it
    is staged in the store (its descriptor closed at once), and unmounted with its folder
    when the last snapshot goes."""
    fd = frozen_layer(make_tree(tmp_path / "tree"))
    device = os.fstat(fd).st_dev
    budget = Budget(1 << 30)
    snapshot = _snapshot(fd, budget)
    assert _closed(fd, device)
    assert _mounted(device) == [str(snapshot.path)]
    folder = snapshot.path.parent
    assert budget.used_bytes == snapshot.total_bytes > 0
    copy = TurnSnapshot(manifest=snapshot.manifest, tree=snapshot._tree)  # another value, one layer
    del snapshot
    gc.collect()
    assert drain(10)
    assert _mounted(device)
    assert budget.used_bytes == copy.total_bytes
    del copy
    gc.collect()
    assert drain(10)
    assert _gone(fd, device)
    assert not folder.exists()
    assert budget.used_bytes == 0


def test_a_layer_past_the_budget_is_refused_and_closed(tmp_path: Path) -> None:
    fd = frozen_layer(make_tree(tmp_path / "tree"))
    device = os.fstat(fd).st_dev
    budget = Budget(100)
    with pytest.raises(SnapshotError, match="budget"):
        _snapshot(fd, budget)
    assert drain(10)
    assert _gone(fd, device)
    assert budget.used_bytes == 0


@pytest.mark.parametrize(
    ("script", "bounds", "match"),
    [
        ("mkfifo pipe", {}, "'pipe' is a fifo"),
        ("for i in 1 2 3 4 5; do : > $i; done", {"max_files": 4}, "more than 4 names"),
        ("head -c 5000 /dev/zero > big", {"max_bytes": 4096}, "5000 bytes"),
    ],
)
def test_a_layer_a_capture_would_refuse_is_refused(
    script: str, bounds: dict[str, int], match: str
) -> None:
    """The refusals are a capture's own (``checked_shape``), and the layer is closed."""
    fd = _layer_of_script(script)
    device = os.fstat(fd).st_dev
    with pytest.raises(SnapshotError, match=match):
        _snapshot(fd, None, **bounds)
    assert drain(10)
    assert _gone(fd, device)


def test_a_socket_in_the_layer_is_refused() -> None:
    mount = writable_tmpfs()
    try:
        os.mkdir("d", dir_fd=mount)
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(f"/proc/self/fd/{mount}/d/s")
        fd = freeze(mount)
    finally:
        os.close(mount)
    device = os.fstat(fd).st_dev
    with pytest.raises(SnapshotError, match="'d/s' is a socket"):
        _snapshot(fd)
    assert drain(10)
    assert _gone(fd, device)


def test_a_writable_layer_is_refused() -> None:
    """Its bytes could change under the digests: only a read-only layer is a snapshot."""
    fd = writable_tmpfs()
    device = os.fstat(fd).st_dev
    with pytest.raises(SnapshotError, match="not read-only"):
        _snapshot(fd)
    assert drain(10)
    assert _gone(fd, device)


def _drive(plan: Generator[FsRequest, FsReply, Any], listing: list[Any], data: bytes) -> Any:
    """Answer a capture plan as a sandbox would: ``listing``, then ``data`` for every read."""
    request = next(plan)
    reply = FsReply(fields={"count": len(listing)}, data=json.dumps(listing).encode())
    sent = 0
    while True:
        try:
            request = plan.send(reply)
        except StopIteration as done:
            return done.value
        length = sum(piece[2] for piece in json.loads(request.data))
        reply = FsReply(data=data[sent : sent + length])
        sent += length


def test_a_capture_over_a_frozen_layer_links_from_its_store_copy(tmp_path: Path) -> None:
    """A later capture whose files are marked the layer's cannot hard-link them across
    filesystems: the layer's copy in the store is made then (once, counted on the
    budget) and its files linked, read from no sandbox, their digests the layer's."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "kept").write_bytes(b"kept bytes")
    budget = Budget(1 << 20)
    source = _snapshot(frozen_layer(tree), budget)
    layer = source.layer
    assert layer is not None
    assert _copy_of(layer) is None  # no copy until a capture would link
    listing = [
        {"name": "kept", "kind": "file", "mode": 0o644, "size": 10, "target": None,
         "lower": True},
    ]  # fmt: skip
    captures = [
        _drive(
            capture(
                timeout=5.0, max_bytes=1 << 20, max_files=10, budget=budget,
                captures=Captures(source, store_copy),
            ),
            listing,
            b"",  # nothing is read: a read would get no bytes, and fail
        )
        for _ in range(3)
    ]  # fmt: skip
    copy = _copy_of(layer)
    assert copy is not None
    kept = os.stat(copy.path / "kept")
    assert kept.st_dev != os.stat(source.path).st_dev
    for snapshot in captures:
        assert snapshot == source
        (entry,) = snapshot.manifest.entries
        assert entry.digest == hashlib.sha256(b"kept bytes").hexdigest()
        assert os.stat(snapshot.path / "kept").st_ino == kept.st_ino
    assert budget.used_bytes == 10 + 10  # the layer's file, and its copy's (shared by all)


def test_a_layers_own_file_is_never_linked(tmp_path: Path) -> None:
    """The files offered for links are the store copy's; were the layer's own offered,
    the writer's link fails across filesystems (EXDEV) and it says so: the capture then
    reads the file, never fails."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "kept").write_bytes(b"kept bytes")
    source = _snapshot(frozen_layer(tree))
    layer = os.fsencode(source.path) + b"/"
    assert Captures(None)._held(source) == {}  # without a copier: read, never linked
    copy = store_copy(source)
    assert copy is not None
    offered = held_files(source, copy)
    assert offered
    assert not [held for held in offered.values() if held.path.startswith(layer)]
    (entry,) = source.manifest.entries
    held = Held(os.fsencode(source.path) + b"/kept", entry)
    writer = TreeWriter(tmp_path / "new")
    try:
        assert not writer.link_held(entry, held)
        assert writer.inodes == {}
    finally:
        writer.close()
    assert not (tmp_path / "new" / "kept").exists()


def test_a_layer_that_cannot_be_staged_leaves_the_fork_to_a_capture(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workspace is frozen, but the host cannot move the layer into its store (a
    kernel's refusal): the layer goes with its descriptor, and the fork's snapshot is a
    capture of the turn's overlay, with the same files."""
    from astralvessel._executor._snapshot import _store

    def refused(fd: int) -> Path:
        raise PermissionError(1, "move_mount refused")

    monkeypatch.setattr(_store, "stage_layer", refused)
    with executor.turn() as parent:
        _sh(parent, "cd /workspace && echo kept > kept")
        (fork,) = parent.fork(1)
        source = fork.snapshot_source
        assert source is not None
        assert source.layer is None
        assert (source.path / "kept").read_bytes() == b"kept\n"
        with fork:
            assert _sh(fork, "cat /workspace/kept") == "kept\n"
        _sh(parent, "cd /workspace && echo more >> kept")
        assert _sh(parent, "cat /workspace/kept") == "kept\nmore\n"

"""A fork of a fork freezes its own layer in place and stacks it over its parent's
(bubblewrap and nsjail, as root and as an ordinary user; Docker as root): nothing is copied
to the store, and its forks open on the stack.

A fresh turn's fork freezes its workspace tmpfs (``test_frozen_fork``); a turn opened on
that layer writes in an overlay whose upper layer is its own tmpfs. Its fork freezes that
upper layer alone and the snapshot is the stack ``[its layer, the parent's]``: as root
the host mounts their read-only overlay in the store as the snapshot's path (listing,
digests, ``save``); as an ordinary user the layers are held by descriptor and their
overlay is made in a user namespace of its own and held too (``_heldmerge``). Each fork
of it lays its own overlay on the layers themselves. Past ``MAX_LAYERS`` a fork of a
fork captures, as before. Real sandboxes, no mocks.
"""

from __future__ import annotations

import gc
import io
import os
from collections.abc import Iterator
from typing import Any

import pytest

from astralvessel import Executor, Registry, TurnSnapshot
from astralvessel._executor._snapshot._reaper import drain
from astralvessel.sandbox.server._messages import MAX_LAYERS

from .test_frozen_fork import _MAKE, _sh, _store_bytes

ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not ROOT, reason="root stages the layers at paths of its store")


def _layers(snapshot: TurnSnapshot) -> tuple[Any, ...]:
    """The frozen layers the snapshot's files are, top first: root's staged ones, an
    ordinary user's held ones."""
    return snapshot.stack if ROOT else snapshot.held_stack


#: What a fork changes above its parent's layer: a file removed (a whiteout), a folder
#: removed and made again (opaque), a name removed and made again as a link, a folder
#: replaced by a file, a file changed, a new file.
_CHANGE = (
    "cd /workspace && rm d/f1 && rm -r d/e && mkdir d/e && echo fresh > d/e/h && "
    "rm shared && ln -s d/f2 shared && rm link && mkdir link && echo in > link/x && "
    "echo changed > d/f3 && echo mine > mine"
)


#: Docker's host lays a fork's overlay itself as root (``docker._cow``); an ordinary user's
#: Docker stack is the reader's to read, merge and save: ``tests/docker/test_frozen_stack_user``.
docker_as_root = pytest.mark.skipif(
    not ROOT, reason="an ordinary user's Docker stack: tests/docker/test_frozen_stack_user.py"
)


@pytest.fixture(params=["bubblewrap", "nsjail", pytest.param("docker", marks=docker_as_root)])
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    with Executor(Registry(), sandbox=request.param) as executor:
        yield executor


def _saved_again(snapshot: TurnSnapshot) -> bool:
    saved = io.BytesIO()
    snapshot.save(saved)
    return TurnSnapshot.load(io.BytesIO(saved.getvalue())) == snapshot


def _fork_of_a_fork(executor: Executor) -> tuple[Any, Any, Any, TurnSnapshot]:
    """A fresh turn with ``_MAKE``'s files, its fork changed by ``_CHANGE``, and that
    fork's fork: the four, the last's source checked to be a stack (root) or a capture."""
    parent = executor.turn()
    _sh(parent, _MAKE)
    (child,) = parent.fork(1)
    _sh(child, _CHANGE)
    before = _store_bytes()
    (grandchild,) = child.fork(1)
    source = grandchild.snapshot_source
    assert source is not None
    assert len(_layers(source)) == 2, "the fork of a fork was captured, not stacked"
    assert _layers(source)[1] is _layers(child.snapshot_source)[0]
    if ROOT:
        assert os.path.ismount(source.path)
    else:  # the merged view, held: no mount of the host's
        assert str(source.path).startswith("/proc/self/fd/")
        assert source.held_layer is None, "a stack's merged view was taken for one layer"
    # No store copy of the parent's layer (64 files of 16 KiB): the store barely grows.
    assert _store_bytes() - before < 64 << 10, "the fork of a fork copied a layer"
    return parent, child, grandchild, source


def test_a_fork_of_a_fork_shows_its_parents_changes_and_copies_nothing(
    executor: Executor,
) -> None:
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    with parent, child, grandchild:
        view = "cd /workspace && ls -A . d d/e link && cat d/e/h shared d/f3 link/x mine"
        expected = _sh(child, view)
        assert "f1" not in expected.split()
        assert _sh(grandchild, view) == expected
        assert os.path.islink(source.path / "shared")
        assert not (source.path / "d/f1").exists()
        assert os.listdir(source.path / "d/e") == ["h"]
        assert os.listdir(source.path / "link") == ["x"]
        assert (source.path / "d/f3").read_bytes() == b"changed\n"
        assert (source.path / "d/f4").read_bytes() == _sh(parent, "cat /workspace/d/f4").encode(
            "utf-8", "surrogateescape"
        )
        # The same files as a capture of them, by content id; and its saved form loads.
        assert child.snapshot() == source
        assert _saved_again(source)


def test_the_three_turns_write_apart_after_the_freeze(executor: Executor) -> None:
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    with parent, child, grandchild:
        (sibling,) = child.fork(1)
        with sibling:
            _sh(child, "cd /workspace && echo later > mine && rm d/f4 && echo c > c")
            _sh(grandchild, "cd /workspace && echo g > mine && rm d/e/h && echo g > g")
            _sh(parent, "cd /workspace && echo p > p")
            assert _sh(child, "cd /workspace && cat mine && ls") == (
                "later\nc\nd\nlink\nmine\noutbox\nshared\n"
            )
            assert _sh(grandchild, "cd /workspace && cat mine && ls && ls d/e") == (
                "g\nd\ng\nlink\nmine\noutbox\nshared\n"
            )
            assert _sh(sibling, "cd /workspace && cat mine d/e/h && ls d | wc -l") == (
                "mine\nfresh\n64\n"
            )
            assert _sh(parent, "cd /workspace && ls") == "d\nlink\noutbox\np\nshared\n"
        assert (source.path / "mine").read_bytes() == b"mine\n"
        assert _saved_again(source)


def test_a_fork_of_a_fork_of_a_fork_stacks_three_layers(executor: Executor) -> None:
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    with parent, child, grandchild:
        _sh(grandchild, "cd /workspace && rm mine && mkdir mine && rm -r link && echo 3 > link")
        (third,) = grandchild.fork(1)
        with third:
            deeper = third.snapshot_source
            assert deeper is not None
            assert len(_layers(deeper)) == 3
            assert _layers(deeper)[1:] == _layers(source)
            view = "cd /workspace && ls -A . mine && cat link shared"
            assert _sh(third, view) == _sh(grandchild, view)
            assert _sh(third, view).startswith(".:\nd\nlink\nmine\noutbox\nshared\n\nmine:\n3\n")
            assert grandchild.snapshot() == deeper
            assert _saved_again(deeper)


def test_a_stack_past_its_bound_is_captured(executor: Executor) -> None:
    turns = [executor.turn()]
    try:
        _sh(turns[0], "echo 0 > /workspace/n")
        for depth in range(1, MAX_LAYERS + 2):
            (fork,) = turns[-1].fork(1)
            turns.append(fork)
            source = fork.snapshot_source
            assert source is not None
            assert len(_layers(source)) == (depth if depth <= MAX_LAYERS else 0)
            assert _sh(fork, f"cat /workspace/n && echo {depth} > /workspace/n") == (
                f"{depth - 1}\n"
            )
    finally:
        for turn in turns:
            turn.close()


def test_the_stack_counts_its_own_layer_on_the_budget(executor: Executor) -> None:
    """The parent's layer (1 MiB) is counted once; the fork's layer adds its own bytes."""
    budget = executor.snapshot_budget
    with executor.turn() as parent:
        _sh(parent, _MAKE)
        (child,) = parent.fork(1)
        with child:
            _sh(child, "head -c 4096 /dev/urandom > /workspace/own")
            before = budget.used_bytes
            (grandchild,) = child.fork(1)
            with grandchild:
                grown = budget.used_bytes - before
                assert 4096 <= grown < 64 << 10


@root_only
def test_the_layers_go_with_the_last_snapshot_and_fork(executor: Executor) -> None:
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    paths = [source.path, *(layer.path for layer in source.stack)]
    assert all(os.path.ismount(path) for path in paths)
    parent.close()
    child.close()
    del parent, child
    gc.collect()
    assert drain(10)
    assert all(os.path.ismount(path) for path in paths), "a layer went while a fork was on it"
    with grandchild:
        assert _sh(grandchild, "cat /workspace/mine") == "mine\n"
    del grandchild, source
    gc.collect()
    assert drain(10)
    assert not any(os.path.ismount(path) for path in paths)


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


@pytest.mark.skipif(ROOT, reason="an ordinary user's layers and merged view are descriptors")
def test_the_held_layers_go_with_the_last_snapshot_and_fork(executor: Executor) -> None:
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    held = [int(str(source.path).rsplit("/", 1)[1])]
    held += [int(layer.held) for layer in source.held_stack]
    before = {fd: _identity(fd) for fd in held}
    assert None not in before.values()
    parent.close()
    child.close()
    del parent, child
    gc.collect()
    assert drain(10)
    assert {fd: _identity(fd) for fd in held} == before, "a layer went while a fork was on it"
    with grandchild:
        assert _sh(grandchild, "cat /workspace/mine") == "mine\n"
    del grandchild, source
    gc.collect()
    assert drain(10)
    assert not any(_identity(fd) == before[fd] for fd in held), "a held layer was kept"


def test_a_busy_fork_of_a_fork_copies_and_says_why(
    executor: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    """A detached process in the fork keeps its layer as it was: its fork captures."""
    with executor.turn() as parent:
        _sh(parent, _MAKE)
        (child,) = parent.fork(1)
        with child:
            _sh(child, _CHANGE + " && echo log > log")
            process = child.start(["sh", "-c", "exec 3>>/workspace/log; sleep 30"])
            with caplog.at_level("INFO", logger="astralvessel.snapshots"):
                (grandchild,) = child.fork(1)
            with grandchild:
                source = grandchild.snapshot_source
                assert source is not None
                assert _layers(source) == ()
                view = "cd /workspace && ls -A . d/e && cat shared"
                assert _sh(grandchild, view) == _sh(child, view)
            refused = [r for r in caplog.records if "freeze_refused" in r.getMessage()]
            assert [r.astralvessel["errno"] for r in refused] == ["EBUSY"]  # type: ignore[attr-defined]
            process.kill()
            _sh(child, "echo on > /workspace/on")


#: A call's attempt to shape how the host reads its layer: the overlay's own attributes
#: set through the overlay (``trusted.*`` is refused; ``user.*`` is a plain attribute,
#: which the stack, read as the fork's overlay was, ignores).
_FORGE = """
import os
for name, key in (("d", "opaque"), ("mine", "redirect"), ("d/f4", "metacopy"), ("d", "whiteout")):
    for space in ("trusted", "user"):
        try:
            os.setxattr("/workspace/" + name, f"{space}.overlay.{key}", b"y" if key != "redirect" else b"/d")
        except OSError:
            pass
"""


def test_a_forks_forged_overlay_attributes_change_nothing_the_stack_shows(
    executor: Executor,
) -> None:
    with executor.turn() as parent:
        _sh(parent, _MAKE)
        (child,) = parent.fork(1)
        with child:
            _sh(child, _CHANGE)
            forged = child.exec(["python3", "-c", _FORGE])
            assert forged.returncode == 0, forged.stderr
            (grandchild,) = child.fork(1)
            with grandchild:
                view = "cd /workspace && ls -A . d | wc -l && cat mine d/f4 | wc -c"
                assert _sh(grandchild, view) == "72\n16389\n"
                source = grandchild.snapshot_source
                assert source is not None
                assert len(os.listdir(source.path / "d")) == 64
                assert (source.path / "d/f4").stat().st_size == 16384
                # The fork's own overlay, laid again at the freeze, lies on the layers
                # themselves too: it reads them as its forks and the stack do.
                assert _sh(child, view) == "72\n16389\n"
                assert child.snapshot() == source


def test_a_hostile_fork_of_a_fork_cannot_change_the_layers(executor: Executor) -> None:
    """A call in the fork of a fork writes, removes and remounts what it can reach: only its
    own upper layer changes; the layers, the stack's view and a sibling stay as they were."""
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    with parent, child, grandchild:
        (sibling,) = child.fork(1)
        with sibling:
            attack = (
                "cd /workspace; echo bad > mine; rm -rf d link; "
                "touch /.vessel-lower/x /.vessel-lower/0/x .vessel-layers/x; "
                "mount -o remount,rw /workspace/.vessel-layers/lower; mount -o remount,rw /; "
                "unshare -rm sh -c 'umount -l /workspace; umount -l /.vessel-lower; "
                "echo bad > /workspace/.vessel-layers/lower/mine; "
                "echo bad > /.vessel-lower/0/mine'; cat /workspace/mine; true"
            )
            assert _sh(grandchild, attack + " 2>/dev/null") == "bad\n"
            view = "cd /workspace && cat mine && ls -A . d | wc -l"
            assert _sh(sibling, view) == _sh(child, view) == "mine\n72\n"
        assert (source.path / "mine").read_bytes() == b"mine\n"
        assert all(os.statvfs(layer.path).f_flag & os.ST_RDONLY for layer in _layers(source))
        assert os.statvfs(source.path).f_flag & os.ST_RDONLY
        assert _saved_again(source)


def test_hard_links_across_the_layers_are_a_captures(executor: Executor) -> None:
    """Links made in the parent, in the fork, and one name of a pair changed in the fork:
    the stack's manifest (its links, its digests, those of the files below taken from
    the parent's snapshot) is a capture's of the same files."""
    with executor.turn() as parent:
        _sh(parent, _MAKE + " && ln d/f5 five && ln d/f6 six && ln d/f9 nine")
        (child,) = parent.fork(1)
        with child:
            _sh(child, "cd /workspace && ln d/f7 seven && echo x >> six && chmod 600 nine")
            (grandchild,) = child.fork(1)
            with grandchild:
                source = grandchild.snapshot_source
                assert source is not None
                assert child.snapshot() == source
                assert _saved_again(source)
                view = "cd /workspace && cat five six seven nine | md5sum"
                assert _sh(grandchild, view) == _sh(child, view)


@pytest.mark.parametrize(
    "backend", ["bubblewrap", "nsjail", pytest.param("docker", marks=docker_as_root)]
)
def test_a_fork_on_a_warm_sandbox_stacks_its_layer_too(backend: str) -> None:
    """A fork that adopted a warm sandbox lies on its layer as a cold one does: its own
    fork stacks, the store growing by no copy (that fork adopting a warm sandbox too:
    ``test_adopted_stack``). Root's Docker host laid that overlay itself."""
    with Executor(Registry(), sandbox=backend, warm=2) as executor, executor.turn() as parent:
        _sh(parent, _MAKE)
        assert executor.wait_warm(120)
        pool = executor._warm
        assert pool is not None
        waiting = list(pool._ready)
        (child,) = parent.fork(1)
        with child:
            _sh(child, _CHANGE)
            assert any(child._session is session for session in waiting), "not adopted"
            before = _store_bytes()
            (grandchild,) = child.fork(1)
            with grandchild:
                source = grandchild.snapshot_source
                assert source is not None
                assert len(_layers(source)) == 2
                assert _store_bytes() - before < 64 << 10, "the adopted fork's layer was copied"
                view = "cd /workspace && ls -A . d/e && cat shared mine"
                assert _sh(grandchild, view) == _sh(child, view)
                assert child.snapshot() == source


def test_the_forks_own_files_stay_apart_after_its_freeze(executor: Executor) -> None:
    """The fork's overlay, laid again at its freeze, lies on its frozen layer over its
    parent's, flat: no two files of two layers share a device and inode in its view (in
    an overlay over its old overlay they could, and its captures took them for links)."""
    parent, child, grandchild, _ = _fork_of_a_fork(executor)
    with parent, child, grandchild:
        each = "cd /workspace && find . -path ./outbox -prune -o -type f -links 1 -print"
        each += " | xargs stat -c '%d:%i' | sort | uniq -d"
        assert _sh(child, each) == _sh(grandchild, each) == ""
        _sh(child, "cd /workspace && echo again > again && ln mine mine2")
        (later,) = child.fork(1)
        with later:
            assert child.snapshot() == later.snapshot_source

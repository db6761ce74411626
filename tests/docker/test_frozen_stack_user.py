"""An ordinary user's Docker fork of a fork freezes its own layer in place and stacks it
over its parent's, as bubblewrap and nsjail do (``tests/snapshot/test_frozen_stack``).

The fork's server, opened on its parent's held layer, makes its workspace tmpfs itself
(``_heldfs``) and passes its own frozen upper layer over the direct channel's socket.
The host cannot read the turns' files (their leased uid's), so its reader container
merges the stack (a read-only overlay it alone may read), lists and hashes it; each
fork of the stack gets every layer with its hello, idmapped by the reader to its own
uid. Nothing is copied to the store. Real containers, no mocks.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest

from astralvessel import Executor, Registry, TurnSnapshot
from astralvessel._executor._snapshot._reaper import drain
from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.server._messages import MAX_LAYERS

from ..snapshot.test_frozen_fork import _MAKE, _sh, _store_bytes
from ..snapshot.test_frozen_stack import _CHANGE, _FORGE
from .conftest import BASE_IMAGE

pytestmark = pytest.mark.skipif(
    os.geteuid() == 0, reason="root's Docker host freezes and stacks by its own mounts"
)


@pytest.fixture
def executor(docker_api: object) -> Iterator[Executor]:
    with Executor(Registry(), sandbox=Docker(base_image=BASE_IMAGE, pull=False)) as executor:
        yield executor


def _fork_of_a_fork(executor: Executor) -> tuple[Any, Any, Any, TurnSnapshot]:
    """A fresh turn with ``_MAKE``'s files, its fork changed by ``_CHANGE``, and that
    fork's fork, whose source is checked to be a held stack of two layers."""
    parent = executor.turn()
    _sh(parent, _MAKE)
    (child,) = parent.fork(1)
    _sh(child, _CHANGE)
    before = _store_bytes()
    (grandchild,) = child.fork(1)
    source = grandchild.snapshot_source
    assert source is not None
    assert child.snapshot_source is not None
    assert len(source.held_stack) == 2, "the fork of a fork was captured, not stacked"
    assert source.held_stack[1] is child.snapshot_source.held_stack[0]
    assert str(source.path).startswith("/proc/self/fd/"), "the merged view is no held mount"
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
        unchanged = "md5sum /workspace/d/f4"
        assert _sh(grandchild, unchanged) == _sh(parent, unchanged)
        # The reader's listing and digests of the stack are a capture's of the same files.
        assert child.snapshot() == source


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
        # A turn opened on the stack later sees the fork as it froze, not as it went on.
        with executor.turn(snapshot=source) as opened:
            assert _sh(opened, "cd /workspace && cat mine && ls") == (
                "mine\nd\nlink\nmine\noutbox\nshared\n"
            )


def test_a_fork_of_a_fork_of_a_fork_stacks_three_layers(executor: Executor) -> None:
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    with parent, child, grandchild:
        _sh(grandchild, "cd /workspace && rm mine && mkdir mine && rm -r link && echo 3 > link")
        (third,) = grandchild.fork(1)
        with third:
            deeper = third.snapshot_source
            assert deeper is not None
            assert len(deeper.held_stack) == 3
            assert deeper.held_stack[1:] == source.held_stack
            view = "cd /workspace && ls -A . mine && cat link shared"
            assert _sh(third, view) == _sh(grandchild, view)
            assert _sh(third, view).startswith(".:\nd\nlink\nmine\noutbox\nshared\n\nmine:\n3\n")
            assert grandchild.snapshot() == deeper


def test_a_stack_past_its_bound_is_captured(executor: Executor) -> None:
    turns = [executor.turn()]
    try:
        _sh(turns[0], "echo 0 > /workspace/n")
        for depth in range(1, MAX_LAYERS + 2):
            (fork,) = turns[-1].fork(1)
            turns.append(fork)
            source = fork.snapshot_source
            assert source is not None
            assert len(source.held_stack) == (depth if depth <= MAX_LAYERS else 0)
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


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


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
                assert source.held_stack == ()
                view = "cd /workspace && ls -A . d/e && cat shared"
                assert _sh(grandchild, view) == _sh(child, view)
            refused = [r for r in caplog.records if "freeze_refused" in r.getMessage()]
            assert [r.astralvessel["errno"] for r in refused] == ["EBUSY"]  # type: ignore[attr-defined]
            process.kill()
            _sh(child, "echo on > /workspace/on")


def test_a_hostile_fork_of_a_fork_cannot_change_the_layers(executor: Executor) -> None:
    """A call in the fork of a fork writes, removes and remounts what it can reach: only its
    own upper layer changes; the layers, a sibling and a new fork of the stack stay as
    they were."""
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    with parent, child, grandchild:
        (sibling,) = child.fork(1)
        with sibling:
            attack = (
                "cd /workspace; echo bad > mine; rm -rf d link; "
                "touch .vessel-layers/x .vessel-layers/held/x .vessel-layers/held1/x; "
                "mount -o remount,rw /workspace/.vessel-layers/held; mount -o remount,rw /; "
                "unshare -rm sh -c 'umount -l /workspace; "
                "echo bad > /workspace/.vessel-layers/held/mine; "
                "echo bad > /workspace/.vessel-layers/held1/shared'; cat /workspace/mine; true"
            )
            assert _sh(grandchild, attack + " 2>/dev/null") == "bad\n"
            view = "cd /workspace && cat mine d/e/h && ls -A . d | wc -l"
            assert _sh(sibling, view) == _sh(child, view) == "mine\nfresh\n72\n"
        assert all(os.statvfs(layer.path).f_flag & os.ST_RDONLY for layer in source.held_stack)
        assert os.statvfs(source.path).f_flag & os.ST_RDONLY
        assert child.snapshot() == source


def test_hard_links_across_the_layers_are_a_captures(executor: Executor) -> None:
    """Links made in the parent, in the fork, and one name of a pair changed in the fork:
    the stack's manifest (its links, the digests of the files below taken from the
    parent's snapshot) is a capture's of the same files."""
    with executor.turn() as parent:
        _sh(parent, _MAKE + " && ln d/f5 five && ln d/f6 six && ln d/f9 nine")
        (child,) = parent.fork(1)
        with child:
            _sh(child, "cd /workspace && ln d/f7 seven && echo x >> six && chmod 600 nine")
            (grandchild,) = child.fork(1)
            with grandchild:
                source = grandchild.snapshot_source
                assert source is not None
                assert len(source.held_stack) == 2
                assert child.snapshot() == source
                view = "cd /workspace && cat five six seven nine | md5sum"
                assert _sh(grandchild, view) == _sh(child, view)


def test_on_the_attach_stream_a_fork_of_a_fork_captures(docker_api: object) -> None:
    """Without the direct channel no layer can be passed: every fork captures, as before."""
    backend = Docker(base_image=BASE_IMAGE, pull=False, direct=False)
    with Executor(Registry(), sandbox=backend) as executor, executor.turn() as parent:
        _sh(parent, _MAKE)
        (child,) = parent.fork(1)
        with child:
            _sh(child, _CHANGE)
            (grandchild,) = child.fork(1)
            with grandchild:
                source = grandchild.snapshot_source
                assert source is not None
                assert source.held_stack == ()
                view = "cd /workspace && ls -A . d/e && cat shared mine"
                assert _sh(grandchild, view) == _sh(child, view)


def test_a_fork_on_a_warm_sandbox_stacks_its_layer_too(docker_api: object) -> None:
    """A fork that adopted a warm sandbox lies on its layer as a cold one does: its own
    fork stacks (and adopts the other warm sandbox, handed the stack: ``test_adopted_stack``)."""
    backend = Docker(base_image=BASE_IMAGE, pull=False)
    with Executor(Registry(), sandbox=backend, warm=2) as executor, executor.turn() as parent:
        _sh(parent, _MAKE)
        (child,) = parent.fork(1)
        with child:
            _sh(child, _CHANGE)
            (grandchild,) = child.fork(1)
            with grandchild:
                source = grandchild.snapshot_source
                assert source is not None
                assert len(source.held_stack) == 2
                view = "cd /workspace && ls -A . d/e && cat d/e/h mine"
                assert _sh(grandchild, view) == _sh(child, view)
                assert child.snapshot() == source


def test_a_forks_forged_overlay_attributes_change_nothing_the_stack_shows(
    executor: Executor,
) -> None:
    """The overlay's own attributes set through the fork's overlay (``trusted.*`` is
    refused, ``user.*`` is a plain attribute there): the reader's merged view, read as the
    fork's overlay was, shows every name as the fork did."""
    with executor.turn() as parent:
        _sh(parent, _MAKE)
        (child,) = parent.fork(1)
        with child:
            _sh(child, _CHANGE)
            forged = child.exec(["python3", "-c", _FORGE])
            assert forged.returncode == 0, forged.stderr
            (grandchild,) = child.fork(1)
            with grandchild:
                source = grandchild.snapshot_source
                assert source is not None
                assert len(source.held_stack) == 2
                view = "cd /workspace && ls -A . d | wc -l && cat mine d/f4 | wc -c"
                assert _sh(grandchild, view) == _sh(child, view) == "72\n16389\n"
                assert child.snapshot() == source

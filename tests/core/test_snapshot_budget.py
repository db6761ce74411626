"""The snapshot budget counts each file once, and dropped trees go in the reaper's thread.

``Budget`` counts a regular file per inode while any live tree of its executor
holds it (incremental snapshots hard-link the files an older tree holds); a
capture checks an estimate before it reads a file and the exact count once its
tree is built. ``_reaper`` removes dropped trees off the caller's thread. The
conformance suite runs the same on the real sandboxes (``test_snapshot_budget``).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from astralvessel import SnapshotError, TurnSnapshot
from astralvessel._executor._snapshot import _reaper
from astralvessel._executor._snapshot._capture import capture
from astralvessel._executor._snapshot._reaper import BUSY_SECONDS, drain, enqueue, remove_folder
from astralvessel._executor._snapshot._reuse import RACY_NS, Captures
from astralvessel._executor._snapshot._store import Budget, Tree, new_folder, store_root
from astralvessel.sandbox import FsReply, FsRequest

KIB = 1 << 10
NOW = 10**18
OLD = NOW - 10 * RACY_NS


def _file(name: str, size: int, ino: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "file",
        "mode": 0o644,
        "size": size,
        "target": None,
        "stat": [ino, OLD, OLD],
        **extra,
    }


def _take(
    budget: Budget, captures: Captures | None, listing: list[dict[str, Any]]
) -> tuple[TurnSnapshot, list[str]]:
    """Drive one capture as a sandbox would (each file's bytes are its name's first byte):
    the snapshot and the names whose bytes it asked for."""
    plan: Generator[FsRequest, FsReply, TurnSnapshot] = capture(
        timeout=5.0, max_bytes=1 << 30, max_files=100, budget=budget, captures=captures
    )
    next(plan)
    reply = FsReply(fields={"now_ns": NOW}, data=json.dumps(listing).encode())
    asked: list[str] = []
    while True:
        try:
            request = plan.send(reply)
        except StopIteration as done:
            return done.value, asked
        wanted = json.loads(request.data)
        asked += [name for name, offset, _ in wanted if offset == 0]
        reply = FsReply(data=b"".join(name[:1].encode() * length for name, _, length in wanted))


def _store_folders() -> set[str]:
    return set(os.listdir(store_root()))


@pytest.fixture
def held_reaper() -> Iterator[threading.Event]:
    """The reaper's thread kept busy (on a job of its own) until the event is set."""
    release = threading.Event()
    started = threading.Event()

    def wait() -> None:
        started.set()
        release.wait(30)

    enqueue(new_folder(), wait)
    assert started.wait(10)
    yield release
    release.set()
    assert drain(30)


def test_a_file_two_trees_hold_counts_once():
    """An inode held by two live trees counts its bytes once; another inode adds its own."""
    budget = Budget(100)
    budget.hold({(1, 1): 10, (1, 2): 5})
    budget.hold({(1, 1): 10, (1, 3): 3})
    assert budget.used_bytes == 18


def test_bytes_go_back_when_the_last_tree_holding_them_goes():
    """Releasing one of two trees keeps the shared file's bytes; releasing both frees them."""
    budget = Budget(100)
    first, second = {(1, 1): 10, (1, 2): 5}, {(1, 1): 10, (1, 3): 3}
    budget.hold(first)
    budget.hold(second)
    budget.release(first)
    assert budget.used_bytes == 13
    budget.release(second)
    assert budget.used_bytes == 0


def test_a_tree_past_the_budget_is_refused_and_counts_nothing():
    """A tree whose new inodes pass the budget raises SnapshotError saying how much is held,
    the budget and how to raise it, and none of its inodes (shared ones neither) count."""
    budget = Budget(20 * KIB)
    budget.hold({(1, 1): 10 * KIB})
    with pytest.raises(SnapshotError) as refused:
        budget.hold({(1, 1): 10 * KIB, (1, 2): 15 * KIB})
    assert "already 0.0 MiB of its budget of 0.0 MiB" in str(refused.value)
    assert "Executor(snapshot_budget_mb=...)" in str(refused.value)
    assert budget.used_bytes == 10 * KIB
    budget.release({(1, 1): 10 * KIB})
    assert budget.used_bytes == 0


def test_a_capture_linking_held_files_adds_only_the_new_bytes():
    """A second capture links the unchanged file: the budget holds it once, plus the new one."""
    budget = Budget(100 * KIB)
    captures = Captures(None)
    first, _ = _take(budget, captures, [_file("a", 60 * KIB, 1)])
    second, asked = _take(budget, captures, [_file("a", 60 * KIB, 1), _file("b", 30 * KIB, 2)])
    assert asked == ["b"]
    assert budget.used_bytes == 90 * KIB
    del first
    gc.collect()
    assert drain(10)
    assert budget.used_bytes == 90 * KIB
    del second
    gc.collect()
    assert drain(10)
    assert budget.used_bytes == 0


def test_the_estimate_refuses_before_a_byte_is_read():
    """Unreused files past the budget refuse the capture at its listing: nothing is read,
    no folder is made."""
    budget = Budget(100 * KIB)
    kept, _ = _take(budget, None, [_file("a", 60 * KIB, 1)])
    before = _store_folders()
    plan = capture(timeout=5.0, max_bytes=1 << 30, max_files=100, budget=budget)
    next(plan)
    listing = [_file("b", 50 * KIB, 2)]
    with pytest.raises(SnapshotError, match=r"budget of 0\.1 MiB"):
        plan.send(FsReply(fields={"now_ns": NOW}, data=json.dumps(listing).encode()))
    assert _store_folders() <= before  # an earlier test's tree may go meanwhile: none comes
    assert budget.used_bytes == 60 * KIB
    del kept


def test_the_exact_check_refuses_what_the_estimate_let_through(tmp_path: Path):
    """Files linked from a loaded snapshot (held by no tree of this budget) pass the estimate
    but count in the exact check: the built tree is refused and removed."""
    made, _ = _take(Budget(1 << 30), None, [_file("a", 60 * KIB, 1)])
    saved = io.BytesIO()
    made.save(saved)
    loaded = TurnSnapshot.load(io.BytesIO(saved.getvalue()))
    budget = Budget(50 * KIB)
    before = _store_folders()
    with pytest.raises(SnapshotError, match=r"holds 0\.1 MiB and .* budget of 0\.0 MiB"):
        _take(budget, Captures(loaded), [_file("a", 60 * KIB, 9, lower=True)])
    gc.collect()
    assert drain(10)
    # The drain may also remove an earlier test's dropped tree: a subset, with nothing new.
    assert _store_folders() <= before
    assert budget.used_bytes == 0


def test_the_bytes_go_back_when_the_tree_is_removed(held_reaper: threading.Event):
    """A dropped tree keeps its bytes until the reaper removes it, then gives them back."""
    budget = Budget(1 << 20)
    tree = Tree(new_folder() / "tree", budget)
    tree.path.mkdir()
    (tree.path / "f").write_bytes(b"x" * 100)
    info = os.stat(tree.path / "f")
    tree.hold({(info.st_dev, info.st_ino): 100})
    folder = tree.path.parent
    del tree
    gc.collect()
    assert budget.used_bytes == 100
    assert folder.exists()
    held_reaper.set()
    assert drain(10)
    assert budget.used_bytes == 0
    assert not folder.exists()


def test_drain_waits_for_every_queued_folder():
    """drain returns once each queued folder is gone and its callback has run."""
    called: list[Path] = []
    folders = [new_folder() for _ in range(20)]
    for folder in folders:
        (folder / "f").write_bytes(b"x")
        enqueue(folder, lambda folder=folder: called.append(folder))
    assert drain(30)
    assert called == folders
    assert not any(folder.exists() for folder in folders)


def test_trees_left_at_exit_are_removed_before_the_process_ends():
    """A process exiting with a tree alive and another queued removes both first."""
    code = (
        "import threading\n"
        "from astralvessel._executor._snapshot._reaper import enqueue\n"
        "from astralvessel._executor._snapshot._store import Tree, new_folder\n"
        "kept = Tree(new_folder() / 'tree', None)\n"
        "kept.path.mkdir(); (kept.path / 'f').write_bytes(b'x')\n"
        "queued = new_folder(); (queued / 'f').write_bytes(b'x')\n"
        "gate = threading.Event()\n"
        "enqueue(new_folder(), lambda: gate.wait(0.5))  # the thread is busy at exit\n"
        "enqueue(queued)\n"
        "print(kept.path.parent); print(queued)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    folders = [Path(line) for line in done.stdout.split()]
    assert len(folders) == 2
    assert not any(folder.exists() for folder in folders)


def test_a_forked_child_starts_an_empty_reaper_of_its_own(held_reaper: threading.Event):
    """A child forked while the parent's reaper is busy and has a folder queued removes its
    own folders on a fresh thread, and never the parent's queued one."""
    queued = new_folder()
    enqueue(queued)
    pid = os.fork()
    if pid == 0:  # the child: its own folder goes, on its own thread
        try:
            own = new_folder()
            enqueue(own)
            os._exit(0 if drain(10) and not own.exists() and queued.exists() else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert queued.exists()
    held_reaper.set()
    assert drain(10)
    assert not queued.exists()


def test_a_busy_folder_is_tried_again(monkeypatch: pytest.MonkeyPatch):
    """A folder that is busy for a while (a lazy unmount under way) is removed once free."""
    folder = new_folder()
    (folder / "f").write_bytes(b"x")
    tries = []
    real_rmdir = os.rmdir

    def busy_three_times(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(path) == os.fspath(folder) and len(tries) < 3:
            tries.append(path)
            raise OSError(errno.EBUSY, "Device or resource busy", os.fspath(path))
        real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", busy_three_times)
    remove_folder(folder, BUSY_SECONDS)
    assert len(tries) == 3
    assert not folder.exists()


def test_a_folder_busy_for_good_is_left_after_its_time(monkeypatch: pytest.MonkeyPatch):
    """A folder busy past the retry time is left (the next host's sweep finds it)."""
    folder = new_folder()
    real_rmdir = os.rmdir

    def always_busy(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(path) == os.fspath(folder):
            raise OSError(errno.EBUSY, "Device or resource busy", os.fspath(path))
        real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", always_busy)
    remove_folder(folder, busy_seconds=0.3)
    assert folder.exists()
    monkeypatch.undo()
    remove_folder(folder)
    assert not folder.exists()


def test_folders_without_write_bits_are_removed():
    """A tree keeping a sandbox's 0555 and 0500 folders, nested, is removed all the same."""
    folder = new_folder()
    deep = folder / "tree" / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "f").write_bytes(b"x")
    (folder / "tree" / "a" / "g").write_bytes(b"y")
    os.chmod(deep, 0o500)
    os.chmod(deep.parent, 0o555)  # noqa: S103 - a sandbox's read-only folder, as kept
    os.chmod(folder / "tree", 0o555)  # noqa: S103 - and the tree's root likewise
    enqueue(folder)
    assert drain(10)
    assert not folder.exists()


def test_the_reaper_is_one_daemon_thread():
    """Every removal of a process runs on one daemon thread, not the caller's."""
    seen: list[threading.Thread] = []
    for _ in range(3):
        enqueue(new_folder(), lambda: seen.append(threading.current_thread()))
    assert drain(10)
    assert len(set(seen)) == 1
    assert seen[0] is not threading.current_thread()
    assert seen[0].daemon
    assert seen[0] is _reaper._reaper.thread


def test_racing_captures_never_pass_the_budget_together():
    """Captures started at once against a budget with room for one: one is kept, each other
    is refused at its estimate with the budget's error, having read nothing, and the bytes
    counted never pass the budget."""
    racers = 6
    budget = Budget(100 * KIB)
    cond = threading.Condition()
    arrived = [0]  # captures refused, or at their first read
    outcomes: list[tuple[str, list[str]]] = []

    def arrive() -> None:
        with cond:
            arrived[0] += 1
            cond.notify_all()

    def race(index: int) -> None:
        plan = capture(timeout=5.0, max_bytes=1 << 30, max_files=100, budget=budget)
        next(plan)
        listing = [_file(f"f{index}", 60 * KIB, 100 + index)]
        reply = FsReply(fields={"now_ns": NOW}, data=json.dumps(listing).encode())
        asked: list[str] = []
        try:
            request = plan.send(reply)
        except SnapshotError as exc:
            arrive()
            outcomes.append((str(exc), asked))
            return
        arrive()
        with cond:  # every capture has passed its estimate, or been refused by it
            cond.wait_for(lambda: arrived[0] == racers, 30)
        try:
            while True:
                wanted = json.loads(request.data)
                asked += [name for name, offset, _ in wanted if offset == 0]
                request = plan.send(FsReply(data=b"x" * sum(n for _, _, n in wanted)))
        except StopIteration as done:
            outcomes.append(("kept", asked))
            kept.append(done.value)
        except SnapshotError as exc:
            outcomes.append((str(exc), asked))

    kept: list[TurnSnapshot] = []
    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == racers
    assert [len(asked) for what, asked in outcomes if what == "kept"] == [1]
    refused = [(what, asked) for what, asked in outcomes if what != "kept"]
    assert len(refused) == racers - 1
    for what, asked in refused:
        assert "of its budget of 0.1 MiB (Executor(snapshot_budget_mb=...))" in what
        assert asked == []
    assert budget.used_bytes == 60 * KIB <= budget.limit_bytes
    assert budget.reserved_bytes == 0


def test_a_capture_that_fails_gives_its_reservation_back():
    """A capture ended by the sandbox's error (or dropped) after its estimate holds nothing:
    the next capture has the whole budget."""
    budget = Budget(100 * KIB)
    plan = capture(timeout=5.0, max_bytes=1 << 30, max_files=100, budget=budget)
    next(plan)
    listing = [_file("a", 60 * KIB, 1)]
    plan.send(FsReply(fields={"now_ns": NOW}, data=json.dumps(listing).encode()))
    assert budget.reserved_bytes == 60 * KIB
    with pytest.raises(SnapshotError, match="cannot be read"):
        plan.send(FsReply(errno="EIO", message="gone"))
    assert budget.reserved_bytes == 0
    dropped = capture(timeout=5.0, max_bytes=1 << 30, max_files=100, budget=budget)
    next(dropped)
    dropped.send(FsReply(fields={"now_ns": NOW}, data=json.dumps(listing).encode()))
    dropped.close()
    assert budget.reserved_bytes == 0
    snapshot, _ = _take(budget, None, [_file("b", 90 * KIB, 2)])
    assert budget.used_bytes == 90 * KIB
    del snapshot


def test_a_trees_hold_and_removal_race_without_losing_bytes(held_reaper: threading.Event):
    """Threads holding a tree's files while another removes it: whatever was counted is
    exactly what its removal gives back, and a hold after the removal is refused."""
    budget = Budget(1 << 30)
    for _ in range(20):
        tree = Tree(new_folder() / "tree", budget)
        start = threading.Barrier(5)

        def hold(index: int, tree: Tree = tree, start: threading.Barrier = start) -> None:
            start.wait(10)
            with contextlib.suppress(SnapshotError):
                tree.hold({(7, index * 100 + i): 1 for i in range(100)})

        def remove(tree: Tree = tree, start: threading.Barrier = start) -> None:
            start.wait(10)
            tree.remove()

        threads = [threading.Thread(target=hold, args=(i,)) for i in range(4)]
        threads.append(threading.Thread(target=remove))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        del tree
    held_reaper.set()
    assert drain(30)
    assert budget.used_bytes == 0


def test_a_child_forked_while_a_thread_holds_the_budget_can_use_it():
    """A fork while another thread holds the budget's lock leaves the child a fresh lock:
    its own snapshots reserve and count, not wait for a thread it does not have."""
    budget = Budget(100 * KIB)
    holding, done = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with budget._lock:
            holding.set()
            done.wait(30)

    thread = threading.Thread(target=hold_the_lock)
    thread.start()
    assert holding.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: SIGALRM ends it should it wait for the lock
            try:
                signal.alarm(30)
                budget.cancel(budget.reserve(KIB))
                os._exit(0 if budget.reserved_bytes == 0 else 1)
            finally:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
        thread.join(30)
    assert os.waitstatus_to_exitcode(status) == 0

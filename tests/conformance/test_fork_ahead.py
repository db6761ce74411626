"""Forks' sandboxes started ahead: ``Turn.fork`` starts them in the background, as a warm
pool does, returns once ``ready`` of them are (the first, by default), and a fork's first
call takes a ready one (or the one being started that no other fork claimed).

A sandbox started ahead goes to exactly one fork and holds the snapshot's files
only; the pool starts at most one per fork, ``FORKS_AHEAD`` at a time, and its
waiting sandboxes die with the executor. A start ahead that fails leaves the fork
to start its own, as any turn does.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from astralvessel import Executor, Turn
from astralvessel import executor as executor_module
from astralvessel._executor._snapshot._reaper import drain
from astralvessel.errors import (
    BackendUnavailableError,
    SandboxError,
    TurnClosedError,
    UsageError,
)
from astralvessel.executor import FORKS_AHEAD
from astralvessel.sandbox import Policy, SandboxSession

from .calls import run_script

#: The name of a warm pool's filler thread, where every start ahead runs.
FILLER = "astralvessel-warm"


def patch_start(
    executor: Executor,
    monkeypatch: pytest.MonkeyPatch,
    ahead: Callable[[], None] = lambda: None,
    cold: Callable[[], None] = lambda: None,
) -> list[str]:
    """Count the backend's starts from here on (``"ahead"`` or ``"cold"``, by thread), each
    after ``ahead`` or ``cold`` ran (a test's failure or gate)."""
    starts: list[str] = []
    real = executor.sandbox.start

    def start(policy: Policy) -> SandboxSession:
        is_ahead = threading.current_thread().name == FILLER
        starts.append("ahead" if is_ahead else "cold")
        (ahead if is_ahead else cold)()
        return real(policy)

    monkeypatch.setattr(executor.sandbox, "start", start)
    return starts


def fork_in_thread(parent: Turn, ready: int) -> tuple[threading.Thread, list[object]]:
    """``parent.fork(2, ready=ready)`` started on a thread of its own, and the list that
    gets what it returned or raised."""
    outcome: list[object] = []

    def fork() -> None:
        try:
            outcome.append(parent.fork(2, ready=ready))
        except Exception as error:  # the test reads it: a thread's error is not raised there
            outcome.append(error)

    forker = threading.Thread(target=fork)
    forker.start()
    return forker, outcome


def test_a_forks_first_call_takes_the_sandbox_started_ahead(executor: Executor):
    """fork(1) starts one sandbox ahead; the fork's first call takes it, with the
    snapshot's files, and the pool starts no other."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        (fork,) = parent.fork(1)
        run_script(parent, "echo parent > /workspace/f")
    assert fork.snapshot_source is not None
    pool = executor._ahead[id(fork.snapshot_source)][1]
    assert pool.wait_filled(60)
    assert pool.ready == 1
    with fork:
        assert run_script(
            fork, "cat /workspace/f && echo mine > /workspace/f && cat /workspace/f"
        ) == ("base\nmine\n")
        assert pool.ready == 0
        assert pool.spent
    with executor.turn(snapshot=fork.snapshot_source) as again:
        assert run_script(again, "cat /workspace/f") == "base\n"


def test_forks_started_ahead_stay_apart(executor: Executor):
    """Two forks taking sandboxes started ahead each see the snapshot and their own writes."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        forks = parent.fork(2)
    assert forks[0].snapshot_source is not None
    assert executor._ahead[id(forks[0].snapshot_source)][1].wait_filled(60)
    try:
        for index, fork in enumerate(forks):
            assert run_script(fork, f"cat /workspace/f; echo {index} > /workspace/f") == "base\n"
        for index, fork in enumerate(forks):
            assert run_script(fork, "cat /workspace/f") == f"{index}\n"
    finally:
        for fork in forks:
            fork.close()


def test_sandboxes_started_ahead_die_with_the_executor(executor: Executor):
    """Forks never used leave their sandboxes waiting until the executor closes: then
    every one is ended."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        forks = parent.fork(5)
    assert forks[0].snapshot_source is not None
    pool = executor._ahead[id(forks[0].snapshot_source)][1]
    assert pool.wait_filled(60)
    waiting = list(pool._ready)
    assert len(waiting) == 2  # FORKS_AHEAD: never one per fork at once
    executor.close()
    assert not any(session.alive() for session in waiting)


def test_sandboxes_started_ahead_go_with_the_forks_snapshot(executor: Executor):
    """Once no fork holds their snapshot, its tree goes and so do the sandboxes started
    ahead for them: a pool never keeps a snapshot alive."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        forks = parent.fork(3)
    snapshot = forks[0].snapshot_source
    assert snapshot is not None
    key, tree = id(snapshot), snapshot.path
    pool = executor._ahead[key][1]
    assert pool.wait_filled(60)
    waiting = list(pool._ready)
    for fork in forks:
        fork.close()
    del forks, fork, snapshot
    gc.collect()
    assert key not in executor._ahead
    assert not any(session.alive() for session in waiting)
    assert drain(60)  # the tree goes in the reaper's thread
    assert not tree.exists()


def test_a_call_right_after_fork_takes_the_sandbox_started_ahead(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """fork(1) returns once its fork's sandbox is ready, so a call made at once takes it:
    no second sandbox starts."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        starts = patch_start(executor, monkeypatch)
        (fork,) = parent.fork(1)
        assert fork.snapshot_source is not None
        pool = executor._ahead[id(fork.snapshot_source)][1]
        waiting = list(pool._ready)
        assert len(waiting) == 1
        with fork:
            assert run_script(fork, "cat /workspace/f") == "base\n"
            assert fork.session is waiting[0]
    assert starts == ["ahead"]
    assert pool.started == 1


def test_first_calls_of_eight_forks_from_eight_threads_each_get_one_sandbox(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """fork(8)'s first calls, all at once from 8 threads: each fork gets one sandbox of its
    own (the ready one, the one in flight, or one it starts), and the pool starts at most
    one per fork, giving up a start for each fork that started its own."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        starts = patch_start(executor, monkeypatch)
        forks = parent.fork(8)
    assert forks[0].snapshot_source is not None
    pool = executor._ahead[id(forks[0].snapshot_source)][1]
    start_line = threading.Barrier(len(forks))

    def first_call(index: int) -> str:
        start_line.wait()
        return run_script(forks[index], f"cat /workspace/f; echo {index} > /workspace/f")

    try:
        with ThreadPoolExecutor(len(forks)) as threads:
            assert list(threads.map(first_call, range(len(forks)))) == ["base\n"] * len(forks)
        assert len({id(fork.session) for fork in forks}) == len(forks)
        for index, fork in enumerate(forks):
            assert run_script(fork, "cat /workspace/f") == f"{index}\n"
        for filler in list(pool._threads):  # every fork took: the pool's starts are over
            filler.join(60)
            assert not filler.is_alive()
        assert pool.started <= len(forks)
        assert starts.count("ahead") == pool.started
        taken_ahead = pool.started - pool.ready
        assert taken_ahead >= 1  # the one fork waited for
        assert taken_ahead + starts.count("cold") == len(forks)  # one sandbox each, no more
        assert pool.ready <= FORKS_AHEAD
    finally:
        for fork in forks:
            fork.close()


def test_a_failed_start_ahead_falls_back_to_a_cold_start(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """A start ahead that fails neither holds fork up nor raises from it: the fork's first
    call starts its own sandbox, with the snapshot's files."""

    def fail() -> None:
        raise SandboxError("the start ahead failed (injected)")

    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        starts = patch_start(executor, monkeypatch, ahead=fail)
        (fork,) = parent.fork(1)
    assert fork.snapshot_source is not None
    pool = executor._ahead[id(fork.snapshot_source)][1]
    assert pool.started == 0
    with fork:
        assert run_script(fork, "cat /workspace/f") == "base\n"
    assert starts == ["ahead", "cold"]


def test_when_every_start_fails_the_forks_first_call_raises_the_one_error(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """A backend that cannot start here: fork returns its forks, and a fork's first call
    raises the error of its own start, once, as any turn's does."""

    def fail() -> None:
        raise BackendUnavailableError("no sandbox can start here (injected)")

    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        starts = patch_start(executor, monkeypatch, ahead=fail, cold=fail)
        (fork,) = parent.fork(1)
    with fork, pytest.raises(BackendUnavailableError, match="injected"):
        fork.exec(["true"])
    assert starts == ["ahead", "cold"]


def test_closing_a_fork_ends_its_calls_wait_for_the_start_ahead(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """A fork's first call waiting for the pool's start in flight holds the turn's lock:
    closing the fork from another thread ends that wait (the call raises TurnClosedError)
    rather than waiting for the start, which here never ends until the test lets it."""
    gate = threading.Event()
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        starts = patch_start(executor, monkeypatch, ahead=lambda: gate.wait(120))
        # fork returns with its start still in flight, as after a slow start
        monkeypatch.setattr(executor_module, "AHEAD_WAIT", 0.1)
        (fork,) = parent.fork(1)
    assert fork.snapshot_source is not None
    pool = executor._ahead[id(fork.snapshot_source)][1]
    outcome: list[object] = []

    def first_call() -> None:
        try:
            outcome.append(fork.exec(["true"]))
        except TurnClosedError as closed:
            outcome.append(closed)

    caller = threading.Thread(target=first_call)
    try:
        caller.start()
        for _ in range(600):  # until the call has claimed the start in flight
            with pool._cond:
                if pool._claims:
                    break
            time.sleep(0.05)
        assert pool._claims == 1
        closer = threading.Thread(target=fork.close)
        closer.start()
        closer.join(30)
        assert not closer.is_alive(), "close waited for the start ahead"
        caller.join(30)
        assert len(outcome) == 1
        assert isinstance(outcome[0], TurnClosedError)
        assert starts == ["ahead"]
    finally:
        gate.set()
        caller.join(60)


def test_fork_with_ready_n_returns_with_every_forks_sandbox_started(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """fork(4, ready=4) returns once all four sandboxes are started: each fork's first
    call takes one of them, as a warm turn's does, and the forks' writes stay apart."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        starts = patch_start(executor, monkeypatch)
        forks = parent.fork(4, ready=4)
        assert forks[0].snapshot_source is not None
        pool = executor._ahead[id(forks[0].snapshot_source)][1]
        waiting = list(pool._ready)
        assert len(waiting) == 4
        assert pool.started == 4
        try:
            for index, fork in enumerate(forks):
                assert run_script(fork, f"cat /workspace/f; echo {index} > /workspace/f") == (
                    "base\n"
                )
            assert {id(fork.session) for fork in forks} == {id(s) for s in waiting}
            for index, fork in enumerate(forks):
                assert run_script(fork, "cat /workspace/f") == f"{index}\n"
            assert run_script(parent, "cat /workspace/f") == "base\n"
        finally:
            for fork in forks:
                fork.close()
    assert starts == ["ahead"] * 4
    assert pool.started == 4  # one per fork, no more


def test_a_fork_of_an_unstarted_fork_grows_the_pool_they_share(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """A fork that has not started forks the same files: its forks share its parent's
    pool, which grows by them, so fork(3, ready=3) still returns with three started."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        starts = patch_start(executor, monkeypatch)
        (child,) = parent.fork(1)
        with child:
            grandchildren = child.fork(3, ready=3)
            assert grandchildren[0].snapshot_source is child.snapshot_source
            pool = executor._ahead[id(child.snapshot_source)][1]
            assert pool.ready >= 3
            assert starts == ["ahead"] * len(starts)
            try:
                for index, fork in enumerate(grandchildren):
                    assert run_script(fork, f"cat /workspace/f; echo {index} > /workspace/f") == (
                        "base\n"
                    )
                assert run_script(child, "cat /workspace/f") == "base\n"
                assert [run_script(fork, "cat /workspace/f") for fork in grandchildren] == [
                    "0\n",
                    "1\n",
                    "2\n",
                ]
            finally:
                for fork in grandchildren:
                    fork.close()
    assert len(starts) <= 4  # one per turn at most: the child and its three forks


def test_afork_with_ready_n_returns_with_every_forks_sandbox_started(executor: Executor):
    """afork(2, ready=2) waits as fork does: both sandboxes are started when it returns."""
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        forks = asyncio.run(parent.afork(2, ready=2))
    try:
        assert forks[0].snapshot_source is not None
        assert executor._ahead[id(forks[0].snapshot_source)][1].ready == 2
        assert [run_script(fork, "cat /workspace/f") for fork in forks] == ["base\n"] * 2
    finally:
        for fork in forks:
            fork.close()


def test_fork_with_ready_0_returns_before_any_start(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """fork(2, ready=0) returns while its starts ahead are still held at a gate; the forks'
    first calls then take them, or start their own."""
    gate = threading.Event()
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        patch_start(executor, monkeypatch, ahead=lambda: gate.wait(120))
        forker, returned = fork_in_thread(parent, ready=0)
        try:
            forker.join(30)  # far under AHEAD_WAIT: a fork that waited is still waiting
            assert not forker.is_alive(), "fork(ready=0) waited for a start"
            (forks,) = returned
            assert isinstance(forks, list)
            assert forks[0].snapshot_source is not None
            pool = executor._ahead[id(forks[0].snapshot_source)][1]
            assert pool.ready == 0
            assert pool.started == 0
        finally:
            gate.set()
            forker.join(120)
    try:
        assert [run_script(fork, "cat /workspace/f") for fork in forks] == ["base\n"] * 2
    finally:
        for fork in forks:
            fork.close()


def test_fork_refuses_a_ready_out_of_bounds(executor: Executor, turn: Turn):
    """ready is a whole number from 0 to n: anything else is UsageError (a ValueError)
    naming the bound, raised before the turn is snapshot or any sandbox starts."""
    for ready in (-1, 3, True, 1.0, "2", None):
        with pytest.raises(UsageError, match=r"ready .* from 0 to n \(2\)"):
            turn.fork(2, ready=ready)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ready"):
        asyncio.run(turn.afork(1, ready=2))
    assert turn._session is None
    assert not executor._ahead


def test_a_failing_start_never_holds_fork_ready_n_up(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """fork(4, ready=4) whose starts ahead all fail returns its forks without raising, and
    each fork's first call starts its own sandbox, with the snapshot's files."""

    def fail() -> None:
        raise SandboxError("the start ahead failed (injected)")

    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        starts = patch_start(executor, monkeypatch, ahead=fail)
        forks = parent.fork(4, ready=4)
    assert forks[0].snapshot_source is not None
    pool = executor._ahead[id(forks[0].snapshot_source)][1]
    try:
        assert [run_script(fork, "cat /workspace/f") for fork in forks] == ["base\n"] * 4
    finally:
        for fork in forks:
            fork.close()
    assert pool.started == 0
    assert starts.count("cold") == 4


def test_a_hanging_start_holds_fork_ready_n_only_for_its_bound(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
):
    """A start ahead that never ends holds fork(2, ready=2) up for AHEAD_WAIT at most (made
    short here): fork returns its forks, and their first calls are served all the same."""
    gate = threading.Event()
    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        patch_start(executor, monkeypatch, ahead=lambda: gate.wait(120))
        monkeypatch.setattr(executor_module, "AHEAD_WAIT", 0.1)
        try:
            forks = parent.fork(2, ready=2)
            assert forks[0].snapshot_source is not None
            assert executor._ahead[id(forks[0].snapshot_source)][1].ready == 0
        finally:
            gate.set()
    try:
        assert [run_script(fork, "cat /workspace/f") for fork in forks] == ["base\n"] * 2
    finally:
        for fork in forks:
            fork.close()


@pytest.mark.parametrize("closed", ["turn", "executor"])
def test_closing_ends_fork_ready_ns_wait(
    executor: Executor, monkeypatch: pytest.MonkeyPatch, closed: str
):
    """Closing the forked turn, or the executor, while fork(2, ready=2) waits for starts
    that never end (until the test lets them) ends the wait: fork returns its forks."""
    gate = threading.Event()
    parent = executor.turn()
    # In a thread of its own: the executor's close joins the fillers held at the gate.
    closer = threading.Thread(target=(parent if closed == "turn" else executor).close)
    try:
        run_script(parent, "echo base > /workspace/f")
        patch_start(executor, monkeypatch, ahead=lambda: gate.wait(120))
        forker, returned = fork_in_thread(parent, ready=2)
        for _ in range(600):  # until fork has its pool: the snapshot is taken
            if executor._ahead or not forker.is_alive():
                break
            time.sleep(0.05)
        assert executor._ahead
        closer.start()
        forker.join(30)  # far under AHEAD_WAIT: a wait not ended is still waiting
        assert not forker.is_alive(), f"closing the {closed} did not end fork's wait"
        (forks,) = returned
        assert isinstance(forks, list)
        assert len(forks) == 2
        for fork in forks:
            fork.close()
    finally:
        gate.set()
        if closer.is_alive():
            closer.join(120)
        parent.close()

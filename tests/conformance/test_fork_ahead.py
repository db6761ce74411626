"""Forks' sandboxes started ahead: ``Turn.fork`` starts them in the background, as a warm
pool does, returns once the first is ready, and a fork's first call takes a ready one
(or the one being started that no other fork claimed).

A sandbox started ahead goes to exactly one fork and holds the snapshot's files
only; the pool starts at most one per fork, ``FORKS_AHEAD`` at a time, and its
waiting sandboxes die with the executor. A start ahead that fails leaves the fork
to start its own, as any turn does.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from astralvessel import Executor
from astralvessel import executor as executor_module
from astralvessel._executor._snapshot._reaper import drain
from astralvessel.errors import BackendUnavailableError, SandboxError, TurnClosedError
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

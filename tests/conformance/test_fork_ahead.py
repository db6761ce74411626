"""Forks' sandboxes started ahead: ``Turn.fork`` starts them in the background, as a warm
pool does, and a fork's first call takes a ready one.

A sandbox started ahead goes to exactly one fork and holds the snapshot's files
only; the pool starts at most one per fork, ``FORKS_AHEAD`` at a time, and its
waiting sandboxes die with the executor.
"""

from __future__ import annotations

import gc

from astralvessel import Executor
from astralvessel._executor._snapshot._reaper import drain

from .calls import run_script


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

"""The snapshot budget on the real sandboxes: distinct bytes, refusals that leave nothing.

An executor's snapshots count against ``snapshot_budget_mb`` per file, once
however many live trees hard-link it, so a fork of a turn whose files mostly did
not change holds about one copy of them; a snapshot past the budget is refused
and leaves nothing in the store; a dropped snapshot gives its bytes back once the
reaper has removed its tree (``drain``).
"""

from __future__ import annotations

import gc
import io
import os
import time
from pathlib import Path

import pytest

from astralvessel import SnapshotError, TurnSnapshot
from astralvessel._executor._snapshot._mechanism import upper_layer_listed
from astralvessel._executor._snapshot._reaper import drain
from astralvessel._executor._snapshot._store import MIB, store_root
from astralvessel.sandbox import Sandbox

from .calls import run_script
from .conftest import suite_executor

#: Four MiB in eight files of two folders, each of its own bytes.
_MAKE = (
    "cd /workspace && mkdir a b && for i in 0 1 2 3; do "
    "head -c 524288 /dev/urandom > a/$i; head -c 524288 /dev/urandom > b/$i; done"
)


def _store_folders() -> set[str]:
    return set(os.listdir(store_root()))


def test_a_fork_holds_its_turns_files_once(backend: Sandbox, agent_dir: Path, data_dir: Path):
    """fork(n) after a snapshot, the turn having changed a little, holds the files once plus
    the change; where the forks' overlay is listed, their own snapshots add only their own."""
    executor = suite_executor(backend, agent_dir, data_dir, snapshot_budget_mb=6)
    budget = executor.snapshot_budget
    with executor, executor.turn() as turn:
        run_script(turn, _MAKE)
        time.sleep(0.3)  # past the capture's racy window: the files are recorded
        first = turn.snapshot()
        assert budget.used_bytes == 4 * MIB
        run_script(turn, "head -c 65536 /dev/urandom > /workspace/changed")
        forks = turn.fork(3)
        assert budget.used_bytes == 4 * MIB + 65536
        kept = [first]
        for index, fork in enumerate(forks):
            with fork:
                run_script(fork, f"printf {index} > /workspace/mine")
                if upper_layer_listed(backend.name):
                    kept.append(fork.snapshot())
                    assert budget.used_bytes == 4 * MIB + 65536 + index + 1


def test_a_snapshot_past_the_budget_leaves_nothing(
    backend: Sandbox, agent_dir: Path, data_dir: Path
):
    """A snapshot whose files pass the budget with those already held is refused, whether
    the estimate sees it (files to read) or the exact count (files linked from a loaded
    snapshot, which no tree of this executor held): nothing of it stays in the store."""
    executor = suite_executor(backend, agent_dir, data_dir, snapshot_budget_mb=3)
    budget = executor.snapshot_budget
    with executor:
        with executor.turn() as turn:
            run_script(turn, "head -c 2097152 /dev/urandom > /workspace/two")
            kept = turn.snapshot()
            saved = io.BytesIO()
            kept.save(saved)
        loaded = TurnSnapshot.load(io.BytesIO(saved.getvalue()))
        with executor.turn() as turn:
            run_script(turn, "head -c 2097152 /dev/urandom > /workspace/other")
            before = _store_folders()
            with pytest.raises(SnapshotError, match=r"already 2\.0 MiB of its budget of 3\.0"):
                turn.snapshot()
        with executor.turn(snapshot=loaded) as opened:
            run_script(opened, "true")
            with pytest.raises(SnapshotError, match=r"already 2\.0 MiB of its budget of 3\.0"):
                opened.snapshot()
        gc.collect()
        assert drain(60)
        assert _store_folders() <= before
        assert budget.used_bytes == 2 * MIB
        del kept


def test_dropped_snapshots_give_their_bytes_back(backend: Sandbox, agent_dir: Path, data_dir: Path):
    """Snapshots each add the files they do not share; dropped, their trees go and the
    budget is back to nothing once the reaper has removed them."""
    executor = suite_executor(backend, agent_dir, data_dir)
    budget = executor.snapshot_budget
    with executor, executor.turn() as turn:
        snapshots = []
        for index in range(3):
            run_script(turn, f"head -c 1048576 /dev/urandom > /workspace/f{index}")
            time.sleep(0.3)  # past the capture's racy window: the next capture links it
            snapshots.append(turn.snapshot())
        assert budget.used_bytes == 3 * MIB  # not 1 + 2 + 3: each links what did not change
        folders = [snapshot.path.parent for snapshot in snapshots]
        assert all(folder.exists() for folder in folders)
        del snapshots
        gc.collect()
        assert drain(60)
        assert budget.used_bytes == 0
        assert not any(folder.exists() for folder in folders)

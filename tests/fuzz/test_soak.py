"""A soak test: 10 000 calls in one turn leave the host's resources where they were."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import pytest

import astralvessel as av

CALLS = 10_000
WARM_UP = 500
# Every CONFINED_EVERY-th call forks a confined command (and leaves an outbox file); the
# rest are file tools answered in the sandbox without a fork, so 10 000 calls stay quick.
CONFINED_EVERY = 50
#: Resident memory the host may gain after the warm-up (allocator noise, not a leak).
RSS_SLACK = 16 << 20

# 10 000 calls: volume, on paths the rest of the suite runs on every Python.
pytestmark = pytest.mark.slow


def _rss() -> int:
    status = Path("/proc/self/status").read_text()
    return next(
        int(line.split()[1]) << 10 for line in status.splitlines() if line.startswith("VmRSS:")
    )


def _held() -> dict[str, set[object]]:
    """The host process's descriptors (by number), threads and tasks (by id) now.

    Compared as sets, not counted: what an earlier test left winding down (a
    session's reader, a collected executor's threads and pipes) may end during
    the calls, and only what the calls added and kept is growth.
    """
    return {
        "fds": set(os.listdir("/proc/self/fd")),
        "threads": set(threading.enumerate()),
        "tasks": set(os.listdir("/proc/self/task")),
    }


def _call(turn: av.Turn, index: int) -> None:
    if index % CONFINED_EVERY:
        result = turn.call("list", {"path": "/workspace"})
    else:
        result = turn.call("bash", {"command": 'echo soak > "$VESSEL_OUTBOX/n"'})
        assert len(result.files) == 1
    assert not result.is_error, result.text


def test_ten_thousand_calls_do_not_grow_the_host(
    executor: av.Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a warm-up, 10 000 calls leave descriptors, threads, memory and temp files flat."""
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    outbox = tmp_path / "outbox"
    mine = av.Executor(executor.registry, sandbox=executor.sandbox, outbox_dir=outbox)
    with mine.turn() as turn:
        for index in range(WARM_UP):
            _call(turn, index)
        rss_before, held_before = _rss(), _held()
        temp_before = sorted(private_tmp.rglob("*"))
        for index in range(WARM_UP, CALLS):
            _call(turn, index)
        rss_after, held_after = _rss(), _held()
        temp_after = sorted(private_tmp.rglob("*"))
    grown = {kind: held_after[kind] - held_before[kind] for kind in held_before}
    assert grown == {"fds": set(), "threads": set(), "tasks": set()}
    assert rss_after - rss_before < RSS_SLACK, (rss_before, rss_after)
    assert temp_after == temp_before
    # Exactly the files the calls were asked to leave, one per confined call.
    assert sum(1 for p in outbox.rglob("*") if p.is_file()) == CALLS // CONFINED_EVERY

"""What an idle turn holds: its file worker starts with the first file request, not with the turn."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from astralvessel.sandbox import FsRequest, Policy, SandboxSession
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._discovery import get_backend
from astralvessel.sandbox._session import ServerSession

BACKENDS = ["bubblewrap", "nsjail"]


def _tree(root: int) -> set[int]:
    """``root`` and every process below it, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def _pythons(session: SandboxSession) -> set[int]:
    """The turn's Python processes on the host (the sandbox binary's own are not Python)."""
    assert isinstance(session, ServerSession)
    assert isinstance(session.channel, PipeChannel)
    mine = set()
    for pid in _tree(session.channel.process.pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("python"):
                mine.add(pid)
        except OSError:
            continue
    return mine


def _settled(session: SandboxSession) -> set[int]:
    """The turn's Python processes once the spare is built: the same set for half a second."""
    deadline = time.monotonic() + 30
    seen = _pythons(session)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _pythons(session)
        if now == seen:
            return now
        seen = now
    pytest.fail(f"the idle turn never settled: {sorted(seen)}")


@pytest.mark.parametrize("name", BACKENDS)
def test_the_file_worker_starts_with_the_first_file_request(name: str) -> None:
    """An idle turn has no file worker; the first file request starts one, the next reuses it."""
    session = get_backend(name).start(Policy())
    try:
        idle = _settled(session)
        first = session.fs(FsRequest(op="list", path="/workspace", timeout=30))
        assert first.errno is None, first.message
        after_first = _pythons(session)
        second = session.fs(FsRequest(op="list", path="/workspace", timeout=30))
        assert second.errno is None, second.message
        after_second = _pythons(session)
    finally:
        session.close()
    (worker,) = after_first - idle
    assert worker in after_second
    assert after_second - after_first == set()

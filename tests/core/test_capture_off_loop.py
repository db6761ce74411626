"""An async turn's snapshot does its host-side work (the store's tree made, files linked,
a frozen layer's copy) on a worker thread, never on the event loop's, on a real sandbox.

A capture of 100 MiB spends seconds between its requests to the sandbox; on the loop's
thread that would stall every other task of an async host (a chat server's sockets, a
rollout's other turns) for as long.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from astralvessel import Executor, Registry
from astralvessel._executor._snapshot import _capture
from astralvessel.sandbox import Bubblewrap


@pytest.fixture
def executor() -> Executor:
    registry = Registry()
    registry.add_builtin("bash")
    return Executor(registry, sandbox=Bubblewrap(), timeout_seconds=30)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The threads on which the capture plan made its tree, one per capture."""
    threads: list[int] = []
    real = _capture._make_unread

    def make_unread(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(_capture, "_make_unread", make_unread)
    return threads


def test_an_async_snapshot_builds_its_tree_off_the_loop(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = _spy(monkeypatch)

    async def main() -> tuple[int, bytes]:
        loop_thread = threading.get_ident()
        async with executor.turn() as turn:
            await turn.awrite_file("notes/a.txt", b"kept\n")
            snapshot = await turn.asnapshot()
        async with executor.turn(snapshot=snapshot) as again:
            read = await again.aread_file("notes/a.txt")
        return loop_thread, read

    loop_thread, read = asyncio.run(main())
    assert read == b"kept\n"
    assert threads, "the capture made no tree"
    assert loop_thread not in threads


def test_a_sync_snapshot_stays_on_the_callers_thread(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = _spy(monkeypatch)
    with executor.turn() as turn:
        turn.write_file("notes/a.txt", b"kept\n")
        snapshot = turn.snapshot()
    assert snapshot.manifest is not None
    assert threads == [threading.get_ident()]


def test_a_cancelled_async_snapshot_leaves_the_turn_working(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its host-side step runs on the thread, the snapshot's await waits
    for that step (one thread in the plan at a time); the turn then snapshots again."""
    started = threading.Event()
    release = threading.Event()
    real = _capture._make_unread

    def slow(*args: Any) -> Any:
        started.set()
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(_capture, "_make_unread", slow)

    async def main() -> bytes:
        async with executor.turn() as turn:
            await turn.awrite_file("notes/a.txt", b"kept\n")
            task = asyncio.ensure_future(turn.asnapshot())
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
            task.cancel()
            # The loop runs on while the step is held: the thread, not the loop, waits.
            await asyncio.sleep(0)
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            monkeypatch.setattr(_capture, "_make_unread", real)
            snapshot = await turn.asnapshot()
        async with executor.turn(snapshot=snapshot) as again:
            return await again.aread_file("notes/a.txt")

    assert asyncio.run(main()) == b"kept\n"

"""The flow drivers: one flow, run in a thread or awaited, sees the same outcomes and errors."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

from astralvessel.web._flow import Emit, Flow, Step, aiterate, arun, in_threads, iterate, run


@attrs.frozen
class Double(Step[int]):
    """A stand-in for I/O: the driver answers with twice ``value``, or fails on a negative."""

    value: int


@attrs.frozen
class Note(Step[None]):
    """Record ``text`` in the driver's log."""

    text: str


class Log:
    """Performs the steps above, sync and async, and remembers what it did."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def double(self, step: Double) -> int:
        """Answer twice the value, or raise as a failing I/O call would."""
        if step.value < 0:
            raise ConnectionRefusedError("negative")
        return step.value * 2

    def note(self, step: Note) -> None:
        """Log the note."""
        self.notes.append(step.text)

    def perform(self) -> dict[type[Step[Any]], Callable[[Any], Any]]:
        """The sync table."""
        return {Double: self.double, Note: self.note}

    def aperform(self) -> dict[type[Step[Any]], Callable[[Any], Awaitable[Any]]]:
        """The async table: the same answers, awaited."""

        async def double(step: Double) -> int:
            await asyncio.sleep(0)
            return self.double(step)

        async def note(step: Note) -> None:
            self.note(step)

        return {Double: double, Note: note}


def add_doubles(values: list[int]) -> Flow[str]:
    """Double each value; a failed step is caught where it was asked for, then cleaned up."""
    total = 0
    try:
        for value in values:
            try:
                total += yield from Double(value)
            except ConnectionRefusedError:
                yield from Note(f"skipped {value}")
    finally:
        yield from Note("closed")
    return f"total {total}"


@pytest.mark.parametrize("mode", ["run", "arun", "arun-in-threads"])
async def test_drivers_agree_on_outcomes_and_errors(mode: str) -> None:
    """Each driver gives the flow the same outcomes and throws the same errors in at the yield."""
    log = Log()
    flow = add_doubles([1, -2, 3])
    if mode == "run":
        result = run(flow, log.perform())
    elif mode == "arun":
        result = await arun(flow, log.aperform())
    else:
        result = await arun(flow, in_threads(log.perform()))
    assert result == "total 8"
    assert log.notes == ["skipped -2", "closed"]


async def test_cancelled_flow_still_runs_its_cleanup_steps() -> None:
    """Cancelling arun throws into the flow, whose finally steps are still performed."""
    log = Log()
    started = asyncio.Event()

    async def hang(step: Double) -> int:
        started.set()
        await asyncio.sleep(3600)
        return 0

    perform = {**log.aperform(), Double: hang}
    task = asyncio.create_task(arun(add_doubles([1]), perform))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log.notes == ["closed"]


def emit_doubles(values: list[int], log: Log) -> Flow[None]:
    """Emit each doubled value as text; note when the flow is closed early."""
    try:
        for value in values:
            doubled = yield from Double(value)
            yield from Emit(str(doubled).encode())
    except GeneratorExit:
        log.notes.append("closed early")
        raise


def test_iterate_yields_what_the_flow_emits() -> None:
    """iterate hands out each emitted chunk and performs the other steps between them."""
    log = Log()
    assert list(iterate(emit_doubles([1, 2, 3], log), log.perform())) == [b"2", b"4", b"6"]


async def test_aiterate_yields_what_the_flow_emits() -> None:
    """aiterate is the same stream, awaited."""
    log = Log()
    chunks = [c async for c in aiterate(emit_doubles([1, 2, 3], log), log.aperform())]
    assert chunks == [b"2", b"4", b"6"]


def test_stopping_early_closes_the_flow() -> None:
    """A consumer that stops reading closes the flow at once, not at garbage collection."""
    log = Log()
    chunks = iterate(emit_doubles([1, 2, 3], log), log.perform())
    assert next(chunks) == b"2"
    chunks.close()
    assert log.notes == ["closed early"]


def test_failing_step_in_a_stream_reaches_the_consumer() -> None:
    """An error the flow does not handle ends the stream with that error."""
    log = Log()
    chunks = iterate(emit_doubles([1, -1], log), log.perform())
    assert next(chunks) == b"2"
    with pytest.raises(ConnectionRefusedError):
        next(chunks)

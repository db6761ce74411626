"""The few awaits the library makes, on any event loop anyio supports (asyncio, trio).

Under asyncio each takes asyncio's own path, unchanged and fastest; under any
other loop it goes through anyio. Nothing here starts an event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import anyio
import anyio.to_thread

__all__ = [
    "cancelled_exception",
    "gather",
    "shielded",
    "time_limit",
    "to_thread",
    "wait_future",
]

_T = TypeVar("_T")

# Threads that only wait on a future resolved by another thread (a sandbox's reader):
# one per call in flight, so they get their own limiter and never starve to_thread.
_WAITERS = anyio.CapacityLimiter(1024)


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def wait_future(future: concurrent.futures.Future[_T], timeout: float | None) -> _T:
    """Await a future another thread resolves; raise ``TimeoutError`` after ``timeout`` s
    (``None``: no limit).

    Cancelling the await leaves the future to its owner, who must settle it.
    """
    if _on_asyncio():
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:  # not the builtin on 3.10
            raise TimeoutError from None
    try:
        return await anyio.to_thread.run_sync(
            future.result, timeout, abandon_on_cancel=True, limiter=_WAITERS
        )
    except concurrent.futures.TimeoutError:  # not the builtin on 3.10
        raise TimeoutError from None


def cancelled_exception() -> type[BaseException]:
    """The exception that cancels a task on the event loop running now."""
    return anyio.get_cancelled_exc_class()


async def to_thread(func: Callable[..., _T], *args: Any, abandon: bool = False) -> _T:
    """Run a blocking function on a worker thread and await its result.

    Cancelling the await waits for the function to return, unless ``abandon``:
    then the await ends at once and the function runs on, its result dropped
    (for work bounded by its own deadline, such as a name lookup).
    """
    return await anyio.to_thread.run_sync(func, *args, abandon_on_cancel=abandon)


def time_limit(seconds: float) -> AbstractContextManager[anyio.CancelScope]:
    """A scope that cancels its body after ``seconds`` and then raises ``TimeoutError``."""
    return anyio.fail_after(max(0.0, seconds))


def shielded() -> anyio.CancelScope:
    """A scope the caller's cancellation cannot reach: for cleanup that must finish."""
    return anyio.CancelScope(shield=True)


async def gather(awaitables: Sequence[Callable[[], Awaitable[_T]]]) -> list[_T]:
    """Run the coroutine functions concurrently; their results in order."""
    results: list[Any] = [None] * len(awaitables)

    async def one(index: int, make: Callable[[], Awaitable[_T]]) -> None:
        results[index] = await make()

    async with anyio.create_task_group() as group:
        for index, make in enumerate(awaitables):
            group.start_soon(one, index, make)
    return results

"""One core per flow: a generator yields the I/O it needs, and two small drivers perform it.

The web package's flows (the `Fetcher`'s redirect loop, a search, a
transport's exchange) hold every decision once and never touch I/O. Where a
flow needs the world it writes ``outcome = yield from SomeStep(...)``: the
driver performs the step and sends the outcome back in, or throws the step's
exception in at that very line, so the flow reads and handles errors as if it
had made the call itself. `run` performs steps in the calling thread, `arun`
awaits them in an event loop; each is given a table from step type to the
function that performs it, and those functions are the only code that
differs between the sync and async halves. This is h11's sans-I/O idea
applied to a whole flow rather than to the wire format alone.

A flow that produces a stream (a response body) yields `Emit` steps, and
`iterate` / `aiterate` turn it into an iterator of what it emits.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Iterator, Mapping
from typing import Any, Generic, TypeVar

import attrs

from .._ground._aio import to_thread

__all__ = [
    "APerform",
    "Emit",
    "Flow",
    "Perform",
    "Step",
    "aclosing_body",
    "aiterate",
    "arun",
    "in_threads",
    "iterate",
    "run",
]

R = TypeVar("R")


class Step(Generic[R]):
    """One piece of I/O a flow asks for; ``yield from step`` hands it over and returns an ``R``."""

    __slots__ = ()

    def __iter__(self) -> Generator[Step[Any], Any, R]:
        outcome: R = yield self
        return outcome


#: A flow: yields steps, receives their outcomes, returns its result.
Flow = Generator[Step[Any], Any, R]
#: How one driver performs each kind of step, by the step's type.
Perform = Mapping[type[Step[Any]], Callable[[Any], Any]]
APerform = Mapping[type[Step[Any]], Callable[[Any], Awaitable[Any]]]


@attrs.frozen
class Emit(Step[None]):
    """Hand ``data`` to whoever iterates the flow (see `iterate`)."""

    data: bytes


class _Driving(Generic[R]):
    """A flow between two steps: what goes in next, the last step's outcome or its error.

    The four drivers differ only in how they perform a step (called or awaited) and in
    whether they hand ``Emit`` steps on; the flow's side of the exchange is this, once.
    Leaving its ``with`` closes the flow (a reader that stops early runs its cleanup now).
    """

    __slots__ = ("_failure", "_flow", "_outcome", "result")

    def __init__(self, flow: Flow[R]) -> None:
        self._flow = flow
        self._outcome: Any = None
        self._failure: BaseException | None = None
        #: What the flow returned, once `steps` has ended.
        self.result: R

    def __enter__(self) -> _Driving[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self._flow.close()

    def steps(self) -> Iterator[Step[Any]]:
        """The flow's steps; each is performed (or emitted) before the next is asked for."""
        while True:
            outcome, failure = self._outcome, self._failure
            self._outcome = self._failure = None
            try:
                step = self._flow.send(outcome) if failure is None else self._flow.throw(failure)
            except StopIteration as stop:
                self.result = stop.value
                return
            yield step

    def perform(self, function: Callable[[Any], Any], step: Step[Any]) -> None:
        """Perform ``step`` in the calling thread: its outcome, or its error, goes in next."""
        try:
            self._outcome = function(step)
        except BaseException as error:  # the flow decides, even on cancellation
            self._failure = error

    async def aperform(self, function: Callable[[Any], Awaitable[Any]], step: Step[Any]) -> None:
        """Await ``step``'s performance: its outcome, or its error, goes in next."""
        try:
            self._outcome = await function(step)
        except BaseException as error:  # the flow decides, even on cancellation
            self._failure = error


def run(flow: Flow[R], perform: Perform) -> R:
    """Drive ``flow`` to its result, performing each step in the calling thread."""
    with _Driving(flow) as driving:
        for step in driving.steps():
            driving.perform(perform[type(step)], step)
        return driving.result


async def arun(flow: Flow[R], perform: APerform) -> R:
    """Drive ``flow`` to its result, awaiting each step; the same loop as `run`."""
    with _Driving(flow) as driving:
        for step in driving.steps():
            await driving.aperform(perform[type(step)], step)
        return driving.result


def iterate(flow: Flow[None], perform: Perform) -> Iterator[bytes]:
    """Drive a streaming flow, yielding what it emits; closing the iterator closes the flow."""
    with _Driving(flow) as driving:
        for step in driving.steps():
            if isinstance(step, Emit):
                yield step.data  # and None goes in
            else:
                driving.perform(perform[type(step)], step)


async def aiterate(flow: Flow[None], perform: APerform) -> AsyncGenerator[bytes, None]:
    """Drive a streaming flow, yielding what it emits; the same loop as `iterate`."""
    with _Driving(flow) as driving:
        for step in driving.steps():
            if isinstance(step, Emit):
                yield step.data  # and None goes in
            else:
                await driving.aperform(perform[type(step)], step)


def aclosing_body(
    body: AsyncGenerator[bytes, None], aclose: Callable[[], Awaitable[None]]
) -> Callable[[], Awaitable[None]]:
    """A response's ``aclose``: close the body's generator, then the exchange.

    A reader may stop early (a service's error quote, a cap); closing the
    generator here runs its flow's cleanup now, not whenever the collector
    finds it, which trio reports as a leak.
    """

    async def close() -> None:
        try:
            await body.aclose()
        finally:
            await aclose()

    return close


def in_threads(perform: Perform) -> APerform:
    """Perform blocking steps in worker threads, so a sync-only transport can serve ``arun``.

    A cancelled step leaves its thread to finish on its own: every blocking step
    is bounded by the request's deadline.
    """

    def threaded(function: Callable[[Any], Any]) -> Callable[[Any], Awaitable[Any]]:
        async def call(step: Any) -> Any:
            return await to_thread(function, step, abandon=True)

        return call

    return {kind: threaded(function) for kind, function in perform.items()}

"""WarmPool's waits for a start in flight, against starts the test lets finish one by one.

A forks' pool (``Turn.fork``) is waited on: ``wait_ready`` until ``fork``'s ``ready``
sandboxes are, and ``take(adopt=True)`` for a start in flight that no other taker claimed.
These tests hold each start at a gate, so which taker waits, which gives up and
what each gets is decided by the pool's counts, not by timing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from astralvessel._executor._warm import WarmPool

#: A bound on every wait of these tests: a wait that reaches it fails the test.
BOUND = 30.0
#: The pool's own bound in a test of what ends a wait first: past ``BOUND``, so a wait
#: that ended only by its bound fails the test.
LONGER = 2 * BOUND


class FakeSession:
    """What the pool uses of a sandbox: alive, close, its backend's name."""

    backend = "fake"

    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False

    def alive(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


class GatedStarts:
    """Starts that each wait for ``release()``; a start released with ``fail`` raises."""

    def __init__(self) -> None:
        self._gate = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._failures: list[bool] = []
        self.count = 0

    def release(self, n: int = 1, *, fail: bool = False) -> None:
        with self._lock:
            self._failures.extend([fail] * n)
        self._gate.release(n)

    def __call__(self) -> Any:
        assert self._gate.acquire(timeout=BOUND), "a start was never released"
        with self._lock:
            fail = self._failures.pop(0)
            self.count += 1
            number = self.count
        if fail:
            raise RuntimeError("the start failed (injected)")
        return FakeSession(number)


@pytest.fixture
def starts() -> GatedStarts:
    return GatedStarts()


@pytest.fixture
def pools(starts: GatedStarts) -> Iterator[list[WarmPool]]:
    made: list[WarmPool] = []
    yield made
    starts.release(100)  # no filler is left waiting at the gate
    for pool in made:
        pool.close()


def forks_pool(
    starts: GatedStarts,
    pools: list[WarmPool],
    size: int,
    total: int,
    *,
    fillers: int = 1,
    first_alone: bool = True,
) -> WarmPool:
    pool = WarmPool(
        None,  # type: ignore[arg-type]  # the fake start needs no backend
        None,  # type: ignore[arg-type]
        size,
        start=starts,
        discard=lambda session: session.close(),
        total=total,
        fillers=fillers,
        first_alone=first_alone,
    )
    pools.append(pool)
    return pool


def until(condition: Any) -> None:
    """Wait (``BOUND`` at most) until ``condition()`` holds, polling."""
    done = threading.Event()
    for _ in range(int(BOUND / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("the pool never got there")


def counts(pool: WarmPool) -> tuple[int, int, int]:
    with pool._cond:
        return len(pool._ready), pool._starting, pool._claims


def test_a_taker_adopts_the_start_in_flight_and_a_second_starts_its_own(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    pool = forks_pool(starts, pools, size=1, total=3)
    until(lambda: counts(pool) == (0, 1, 0))
    with ThreadPoolExecutor(1) as first:
        adopted = first.submit(pool.take, adopt=True)
        until(lambda: counts(pool) == (0, 1, 1))
        # The start in flight is claimed: a second taker gets none and starts its own.
        assert pool.take(adopt=True) is None
        assert not adopted.done()
        starts.release()
        session = adopted.result(BOUND)
    assert isinstance(session, FakeSession)
    assert session.number == 1
    assert pool.started == 1


def test_a_plain_take_never_waits_for_a_start(starts: GatedStarts, pools: list[WarmPool]) -> None:
    """The executor's warm pool keeps its semantics: a ready sandbox or None at once."""
    pool = forks_pool(starts, pools, size=1, total=2)
    until(lambda: counts(pool) == (0, 1, 0))
    assert pool.take() is None
    assert counts(pool) == (0, 1, 0)


def test_a_failed_start_lets_its_claimer_go_empty_handed(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    pool = forks_pool(starts, pools, size=1, total=1)
    until(lambda: counts(pool) == (0, 1, 0))
    with ThreadPoolExecutor(1) as first:
        adopted = first.submit(pool.take, adopt=True)
        until(lambda: counts(pool)[2] == 1)
        starts.release(fail=True)
        assert adopted.result(BOUND) is None
    assert pool.started == 0
    assert not pool.wait_ready(1, BOUND)  # failed and spent: False, never the error


def test_abandon_ends_an_adopted_wait(starts: GatedStarts, pools: list[WarmPool]) -> None:
    pool = forks_pool(starts, pools, size=1, total=1)
    until(lambda: counts(pool) == (0, 1, 0))
    closing = threading.Event()
    with ThreadPoolExecutor(1) as first:
        adopted = first.submit(pool.take, adopt=True, abandon=closing)
        until(lambda: counts(pool)[2] == 1)
        closing.set()
        assert adopted.result(BOUND) is None
    assert counts(pool) == (0, 1, 0)  # the start goes on; its sandbox is the pool's
    starts.release()
    assert pool.wait_ready(1, BOUND)


def test_wait_ready_returns_once_the_first_is_ready(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    pool = forks_pool(starts, pools, size=2, total=4)
    assert not pool.wait_ready(1, 0.05)  # nothing ready yet: the timeout, not an error
    starts.release()
    assert pool.wait_ready(1, BOUND)
    assert pool.ready == 1


def test_the_second_filler_starts_only_once_the_first_sandbox_is_ready(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    pool = forks_pool(starts, pools, size=2, total=4, fillers=2)
    until(lambda: counts(pool) == (0, 1, 0))
    assert len(pool._threads) == 1
    starts.release()
    until(lambda: counts(pool) == (1, 1, 0))
    assert len(pool._threads) == 2
    taken = pool.take(adopt=True)
    assert taken is not None
    until(lambda: counts(pool) == (0, 2, 0))  # two starts at once: ready + starting < size


def test_takers_from_many_threads_never_take_more_than_the_pool_started(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    """Eight forks' first calls at once: each gets a sandbox of the pool or none (it starts
    its own), no sandbox goes to two, and every miss gives up one of the pool's starts, so
    its fillers end once every fork has taken."""
    forks = 8
    pool = forks_pool(starts, pools, size=2, total=forks, fillers=2)
    starts.release()
    assert pool.wait_ready(1, BOUND)
    line = threading.Barrier(forks + 1)

    def first_call(_: int) -> FakeSession | None:
        line.wait(BOUND)
        return pool.take(adopt=True)  # type: ignore[return-value]

    with ThreadPoolExecutor(forks) as threads:
        taken = threads.map(first_call, range(forks))
        line.wait(BOUND)
        starts.release(forks)  # every start the pool may still make ends now
        got = [session for session in taken if session is not None]
    assert len({session.number for session in got}) == len(got)
    for filler in list(pool._threads):
        filler.join(BOUND)
        assert not filler.is_alive()
    assert 1 <= len(got) <= pool.started <= forks
    assert pool.started - len(got) == pool.ready  # the rest wait, for nobody, until close


def test_wait_ready_returns_once_every_fork_of_ready_n_is_started(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    """fork(4, ready=4)'s pool: both fillers start at once, the wait ends once four are
    ready, and the pool starts no fifth."""
    pool = forks_pool(starts, pools, size=4, total=4, fillers=2, first_alone=False)
    until(lambda: counts(pool) == (0, 2, 0))  # two starts at once, none ready yet
    with ThreadPoolExecutor(1) as waiter:
        waited = waiter.submit(pool.wait_ready, 4, LONGER)
        starts.release(3)
        until(lambda: counts(pool) == (3, 1, 0))
        assert not waited.done()
        starts.release()
        assert waited.result(BOUND)
    assert pool.ready == 4
    assert pool.started == 4
    assert pool.spent is False
    for filler in list(pool._threads):  # every start is made: the fillers end
        filler.join(BOUND)
        assert not filler.is_alive()


def test_wait_ready_ends_when_a_start_fails(starts: GatedStarts, pools: list[WarmPool]) -> None:
    """A start that fails ends the wait with False, never its error."""
    pool = forks_pool(starts, pools, size=4, total=4, fillers=2, first_alone=False)
    with ThreadPoolExecutor(1) as waiter:
        waited = waiter.submit(pool.wait_ready, 4, LONGER)
        starts.release()
        starts.release(fail=True)
        assert waited.result(BOUND) is False


def test_wait_ready_ends_when_the_pool_starts_no_more(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    """A pool that holds fewer than the wait asks for (a fork of an unstarted fork shares
    its parent's) ends the wait once it is full, rather than waiting out the bound."""
    pool = forks_pool(starts, pools, size=2, total=8, fillers=2)
    with ThreadPoolExecutor(1) as waiter:
        waited = waiter.submit(pool.wait_ready, 4, LONGER)
        starts.release(2)
        assert waited.result(BOUND) is False
    assert pool.ready == 2


def test_wait_ready_is_bounded_per_start(starts: GatedStarts, pools: list[WarmPool]) -> None:
    """A start that hangs holds the wait only for its bound: the wait gives up (False)."""
    pool = forks_pool(starts, pools, size=2, total=2, fillers=2, first_alone=False)
    starts.release()  # one start ends; the other hangs at the gate
    assert not pool.wait_ready(2, 0.2)
    assert pool.ready == 1


def test_closing_or_abandoning_ends_wait_ready(starts: GatedStarts, pools: list[WarmPool]) -> None:
    """The forked turn closing (``abandon``) or the pool closing ends the wait."""
    pool = forks_pool(starts, pools, size=2, total=2, fillers=2, first_alone=False)
    closing = threading.Event()
    with ThreadPoolExecutor(2) as waiters:
        abandoned = waiters.submit(pool.wait_ready, 2, LONGER, closing)
        closed = waiters.submit(pool.wait_ready, 2, LONGER)
        until(lambda: counts(pool) == (0, 2, 0))
        closing.set()
        assert abandoned.result(BOUND) is False
        assert not closed.done()
        starts.release(2)  # close joins the fillers: let their starts end
        pool.close()
        assert closed.result(BOUND) is False


def _no_warm_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every filler thread fail to start, as at a thread limit or interpreter exit."""
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "astralvessel-warm":
            raise RuntimeError("can't start new thread (injected)")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)


def test_no_filler_thread_ends_the_waits_and_takers_start_their_own(
    starts: GatedStarts, pools: list[WarmPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool whose filler cannot start has no start coming: fork's wait ends at once
    (False, never an error), a taker gets none and starts its own, and wait_filled
    raises why, rather than any of them waiting out its bound."""
    _no_warm_threads(monkeypatch)
    pool = forks_pool(starts, pools, size=2, total=2, fillers=2, first_alone=False)
    assert pool.wait_ready(2, LONGER) is False
    assert pool.take(adopt=True) is None
    with pytest.raises(RuntimeError, match="can't start new thread"):
        pool.wait_filled(LONGER)
    assert starts.count == 0


def test_a_second_filler_that_cannot_start_leaves_the_first_filling(
    starts: GatedStarts, pools: list[WarmPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the first sandbox is ready a forks' pool adds a filler; if that thread cannot
    start, the first filler goes on and fills the pool alone."""
    pool = forks_pool(starts, pools, size=3, total=3, fillers=2)
    until(lambda: counts(pool) == (0, 1, 0))
    _no_warm_threads(monkeypatch)
    with ThreadPoolExecutor(1) as waiter:
        waited = waiter.submit(pool.wait_ready, 3, LONGER)
        starts.release(3)
        assert waited.result(BOUND) is True
    assert pool.started == 3
    assert len(pool._threads) == 1


def test_extend_replaces_the_filler_that_ended(starts: GatedStarts, pools: list[WarmPool]) -> None:
    """A pool whose starts are all made has no filler left; ``extend`` (a fork of a fork
    that has not started) starts one again, which makes exactly the starts added."""
    pool = forks_pool(starts, pools, size=2, total=2, fillers=2)
    starts.release(2)
    assert pool.wait_ready(2, LONGER)
    for filler in list(pool._threads):
        filler.join(BOUND)
    assert counts(pool) == (2, 0, 0)
    pool.extend(3, 3)
    with ThreadPoolExecutor(1) as waiter:
        waited = waiter.submit(pool.wait_ready, 3, LONGER)
        starts.release()
        assert waited.result(BOUND) is True
    taken = [pool.take() for _ in range(3)]
    assert all(session is not None for session in taken)
    starts.release(2)
    until(lambda: pool.started == 5 and pool.ready == 2)
    assert pool.spent is False
    assert pool.take() is not None
    assert pool.take() is not None
    assert pool.spent is True  # 2 + 3 started, no more: one per fork
    assert starts.count == 5


def test_a_pool_extended_again_and_again_keeps_only_its_live_fillers(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    """Each ``extend`` after the fillers ended starts a new one; the pool holds the
    threads it joins at close, and drops the ended ones rather than grow by one a fork."""
    pool = forks_pool(starts, pools, size=1, total=1)
    for round_ in range(20):
        starts.release()
        until(lambda: pool.ready == 1)
        assert pool.take() is not None
        for filler in list(pool._threads):
            filler.join(BOUND)
        assert not any(filler.is_alive() for filler in pool._threads)
        pool.extend(1, 1)
        assert len(pool._threads) == 1, round_
    starts.release()
    until(lambda: pool.ready == 1)
    assert starts.count == 21


def warm_pool(starts: GatedStarts, pools: list[WarmPool], size: int) -> WarmPool:
    """An executor's warm pool (no bound on its starts), every start already let through."""
    starts.release(size + 4)
    pool = forks_pool(starts, pools, size=size, total=0)
    pool._left = None  # the executor's own pool starts without end
    pool.extend(0, size)
    assert pool.wait_filled(BOUND)
    return pool


def test_a_forks_adoption_holds_the_refill_back_while_it_settles(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    """A take with ``settle`` starts nothing for that long, though the next start is let
    through: the adopted fork's first call has the cores. A plain take refills at once."""
    pool = warm_pool(starts, pools, size=2)
    assert pool.take(settle=LONGER) is not None
    assert not pool.wait_filled(0.5)
    assert starts.count == 2
    pool.close()
    assert not any(filler.is_alive() for filler in pool._threads)  # a close ends the wait

    plain = warm_pool(starts, pools, size=1)
    assert plain.take() is not None
    assert plain.wait_filled(BOUND)


def test_settling_is_counted_from_the_first_adoption_not_the_last(
    starts: GatedStarts, pools: list[WarmPool]
) -> None:
    """Adoptions one after another never hold the refill back past the first one's
    ``settle``: forking on and on still has its warm sandboxes refilled."""
    pool = warm_pool(starts, pools, size=2)
    assert pool.take(settle=0.2) is not None
    assert pool.take(settle=LONGER) is not None
    assert pool.wait_filled(BOUND)
    assert starts.count == 4

"""A turn's egress proxy thread ends with the turn: closed, collected unclosed, or failed to start."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import pytest

from astralvessel import Executor, Registry, SandboxError, UsageError
from astralvessel.sandbox._discovery import get_backend
from astralvessel.testing import FakeExec, FakeSandbox

ALLOW = ["pypi.org"]


@pytest.fixture
def new_proxy_threads() -> Callable[[], list[threading.Thread]]:
    """The egress threads this test started (those alive before it are not its own)."""
    # The Thread objects themselves: an ident is an address the next thread may reuse once an
    # older thread (alive at this point, say an earlier test's) ends, which hid a new one.
    before = set(threading.enumerate())

    def started() -> list[threading.Thread]:
        return [
            thread
            for thread in threading.enumerate()
            if thread.name == "astralvessel-egress" and thread not in before
        ]

    return started


def _ended(threads: list[threading.Thread]) -> list[threading.Thread]:
    """The threads still alive after each was given its close's own bound to end."""
    for thread in threads:
        thread.join(timeout=15.0)
    return [thread for thread in threads if thread.is_alive()]


def test_a_closed_turn_stops_its_proxy(new_proxy_threads):
    """Closing the turn ends its proxy's thread."""
    with Executor(Registry(), sandbox=FakeSandbox(exec="ok"), network_allow=ALLOW) as executor:
        with executor.turn() as turn:
            turn.exec(["true"])
            threads = new_proxy_threads()
            assert len(threads) == 1
        assert _ended(threads) == []


def test_a_turn_collected_unclosed_stops_its_proxy_and_its_sandbox(new_proxy_threads):
    """A turn dropped without close ends its sandbox and its proxy's thread when collected."""
    fake = FakeSandbox(exec="ok")
    executor = Executor(Registry(), sandbox=fake, network_allow=ALLOW)
    turn = executor.turn()
    turn.exec(["true"])
    session = turn.session
    threads = new_proxy_threads()
    assert len(threads) == 1
    del turn
    gc.collect()
    assert _ended(threads) == []
    assert not session.alive()
    assert fake.open_sessions == 0
    executor.close()


def test_a_turn_whose_sandbox_dies_keeps_one_proxy(new_proxy_threads):
    """A sandbox that dies is replaced under the same proxy; no second thread is started."""

    def dies(call: FakeExec) -> str:
        raise SandboxError("the sandbox died")

    fake = FakeSandbox(exec={("crash",): dies, ("ok",): "fine"})
    with Executor(Registry(), sandbox=fake, network_allow=ALLOW) as executor:
        with executor.turn() as turn:
            for _ in range(3):
                with pytest.raises(SandboxError):
                    turn.exec(["crash"])
                assert turn.exec(["ok"]).stdout == b"fine"
            threads = new_proxy_threads()
            assert len(threads) == 1
        assert _ended(threads) == []


def test_a_sandbox_that_refuses_to_start_leaves_no_proxy(new_proxy_threads):
    """The proxy started before a sandbox that refuses the turn is stopped with the refusal."""
    executor = Executor(Registry(), sandbox=get_backend("unconfined"), network_allow=ALLOW)
    with executor.turn() as turn:
        for _ in range(3):
            with pytest.raises(UsageError, match="allow-list"):
                turn.exec(["true"])
    assert _ended(new_proxy_threads()) == []
    executor.close()

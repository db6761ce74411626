"""The lifeline thread that starts every sandbox process: a failed start stalls nothing."""

from __future__ import annotations

import threading

import pytest

from astralvessel.sandbox._lifeline import _Lifeline


def test_a_thread_that_cannot_start_leaves_the_next_job_to_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
):
    """When the thread cannot start (RuntimeError, as at shutdown or past a thread limit)
    the job's caller gets the error, and the next job starts a thread of its own rather
    than wait on the one that never ran."""
    lifeline = _Lifeline()
    real_start = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="can't create new thread"):
        lifeline.run(threading.get_ident)
    monkeypatch.setattr(threading.Thread, "start", real_start)
    ran: list[int] = []
    caller = threading.Thread(target=lambda: ran.append(lifeline.run(threading.get_ident)))
    caller.daemon = True  # a stalled one must not hold the test run at exit
    caller.start()
    caller.join(60)  # bounded only so a stall fails the test rather than hang it
    assert len(ran) == 1
    assert ran[0] not in (caller.ident, threading.get_ident())

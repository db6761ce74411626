"""The freeze's place among the file requests (``_fsqueue.submit_local``): it never runs
while the file worker holds a request, and its answer is an ``fs_result`` like theirs."""

from __future__ import annotations

from typing import Any

from astralvessel.sandbox.server._fsqueue import FsQueue
from astralvessel.sandbox.server._lean import Selector


def _queue() -> tuple[FsQueue, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    queue = FsQueue(lambda header, body: sent.append(header), Selector(), lambda: True)
    return queue, sent


def test_the_servers_own_answer_waits_for_the_workers_request() -> None:
    """Queued behind a request the worker holds, the freeze runs once that one is answered."""
    queue, sent = _queue()
    ran: list[int] = []

    def freeze() -> dict[str, Any]:
        ran.append(2)
        return {"fd": 9}

    queue.busy = (1, float("inf"), 1.0)
    queue.submit_local(2, freeze)
    assert (ran, sent) == ([], [])
    queue.busy = None  # the worker answered request 1
    queue.feed()
    assert ran == [2]
    assert sent == [{"fd": 9, "type": "fs_result", "id": 2}]


def test_server_answers_in_a_row_need_no_worker() -> None:
    """Two of the server's own answers in a row start no worker; a refusal is an error."""
    queue, sent = _queue()
    queue.submit_local(3, lambda: {"error": {"errno": "EBUSY", "message": "busy"}})
    queue.submit_local(4, dict)
    assert [h["id"] for h in sent] == [3, 4]
    assert sent[0]["error"]["errno"] == "EBUSY"
    assert queue.worker is None


def test_retire_leaves_a_busy_worker_alone() -> None:
    """A worker holding a request is not retired under it (its answer would be lost)."""
    queue, _ = _queue()
    queue.busy = (1, float("inf"), 1.0)
    queue.retire()
    assert queue.busy is not None

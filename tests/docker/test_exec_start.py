"""docker-exec's hold on the engine bound until an exec runs, and its turns under hostile conditions."""

from __future__ import annotations

import concurrent.futures
import http.client
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from astralvessel import Executor, Registry, ToolSpec
from astralvessel.errors import SandboxError, TurnClosedError
from astralvessel.sandbox import Policy, RunOutcome, RunRequest
from astralvessel.sandbox.docker import DockerExec
from astralvessel.sandbox.docker._exec_session import ExecSession
from astralvessel.sandbox.docker._exec_stream import ExecStream, take_ready
from astralvessel.sandbox.docker._spec import READY

from .conftest import NOPYTHON_IMAGE, SMALL_LIMITS

#: A bound of this process alone, so the test can see every place of it free or held.
SIZE = 2


@pytest.fixture
def backend(docker_api: object) -> DockerExec:
    """docker-exec on the image without Python, with a small bound kept in this process."""
    return DockerExec(
        image=NOPYTHON_IMAGE, pull=False, engine_concurrency=SIZE, engine_scope="process"
    )


@pytest.fixture
def session(backend: DockerExec) -> Iterator[ExecSession]:
    """A docker-exec turn, closed after the test."""
    turn = backend.start(Policy(limits=SMALL_LIMITS))
    assert isinstance(turn, ExecSession)
    try:
        yield turn
    finally:
        turn.close()


def _run(session: ExecSession, script: str, timeout: float = 30.0) -> RunOutcome:
    return session.run(
        RunRequest(argv=["/bin/sh", "-c", script], timeout=timeout, output_chars=10_000)
    )


def _every_place_free(backend: DockerExec) -> bool:
    """Whether all of the bound's places can be held at once now (then given back)."""
    api = backend.engine.api()
    slots = []
    try:
        for _ in range(SIZE):
            slots.append(api.runc_slot(time.monotonic() + 30))
    except TimeoutError:
        return False
    finally:
        for slot in slots:
            slot.release()
    return True


def test_the_ready_pair_is_taken_whole_split_or_not_at_all() -> None:
    """READY is stripped whole or split over pieces; other first bytes are output, kept whole."""
    assert take_ready(b"", READY + b"out") == (READY, b"out", True)
    assert take_ready(b"", READY[:1]) == (READY[:1], b"", False)
    assert take_ready(READY[:1], READY[1:] + b"x") == (READY, b"x", True)
    assert take_ready(b"", b"OCI runtime exec failed") == (READY, b"OCI runtime exec failed", True)
    assert take_ready(READY[:1], b"zz") == (READY, READY[:1] + b"zz", True)


class _ReorderingEngine:
    """An engine whose exec stream is a socket this test writes: the one way to force the
    order a loaded engine gives at random (its stdout and stderr copiers race)."""

    def __init__(self, stream: socket.socket) -> None:
        self._stream = stream
        self.ungated = self

    def runc_slot(self, start_by: float) -> _Place:
        return _Place()

    def exec_create(self, container: str, argv: list[str], **options: object) -> dict[str, str]:
        return {"Id": "exec-1"}

    def exec_start(self, exec_id: str, *, socket: bool) -> socket.socket:
        return self._stream


class _Place:
    def release(self) -> None:
        pass


def _frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(payload)) + payload


def test_stderr_that_overtakes_the_ready_pair_leaves_it_stripped() -> None:
    """The exec's first stderr before stdout's READY (split, even) still leaves READY out."""
    host, engine = socket.socketpair()
    with host, engine:
        engine.sendall(
            _frame(2, b"err\n")
            + _frame(1, READY[:1])
            + _frame(2, b"more\n")
            + _frame(1, READY[1:] + b"out\n")
        )
        engine.shutdown(socket.SHUT_WR)
        stream = ExecStream(
            _ReorderingEngine(host), "container", ["true"], start_by=time.monotonic() + 30
        )
        pieces = list(stream.read(30.0))
    assert pieces == [(2, b"err\n"), (2, b"more\n"), (1, b"out\n")]
    assert stream.running_at is not None


def test_output_never_shows_the_ready_pair(session: ExecSession) -> None:
    """A call's output starts with its own first byte; the pair the shell wrote first is gone."""
    outcome = _run(session, "printf first; printf '\\036\\037' >&2")
    assert outcome.output == "first" + READY.decode()  # the call's own pair is its output
    assert outcome.exit_code == 0


def test_output_the_engine_sent_with_its_answer_is_kept(
    session: ExecSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast call whose output arrived with the engine's answer to its start keeps that output."""
    begin = http.client.HTTPResponse.begin

    def late_begin(response: http.client.HTTPResponse) -> None:
        # A busy host reads the engine's answer late: by then the exec has run and its
        # frames sit behind the answer, where the SDK's reader takes them with it.
        if response._method == "POST":  # type: ignore[attr-defined]
            time.sleep(0.4)
        begin(response)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late_begin)
    outcomes = [_run(session, f"echo fast {n}") for n in range(3)]
    assert [(o.output, o.exit_code) for o in outcomes] == [(f"fast {n}\n", 0) for n in range(3)]


def test_many_fast_calls_of_turns_at_once_keep_their_output(backend: DockerExec) -> None:
    """Four turns making fast calls at once from threads: every call's output comes back whole."""
    turns = [backend.start(Policy(limits=SMALL_LIMITS)) for _ in range(4)]

    def calls(index: int) -> list[str]:
        return [_run(turns[index], f"echo {index} {n}").output for n in range(10)]

    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outputs = list(pool.map(calls, range(4)))
    finally:
        for turn in turns:
            turn.close()
    assert outputs == [[f"{i} {n}\n" for n in range(10)] for i in range(4)]


def test_a_call_waits_for_a_place_and_its_timeout_starts_when_it_runs(
    backend: DockerExec, session: ExecSession
) -> None:
    """Every place held elsewhere for 3 s: a 2 s call still runs whole once it gets one."""
    api = backend.engine.api()
    slots = [api.runc_slot() for _ in range(SIZE)]
    releaser = threading.Timer(3.0, lambda: [slot.release() for slot in slots])
    releaser.start()
    try:
        outcome = _run(session, "sleep 1; echo ran", timeout=2.0)
    finally:
        releaser.join()
    assert (outcome.output, outcome.timed_out) == ("ran\n", False)
    assert _every_place_free(backend)


def test_an_engine_too_busy_to_start_the_call_is_one_clear_error(
    backend: DockerExec, session: ExecSession
) -> None:
    """No place frees within start_timeout: SandboxError saying so, no hang; the turn lives on."""
    api = backend.engine.api()
    slots = [api.runc_slot() for _ in range(SIZE)]
    session.start_timeout = 0.5
    try:
        with pytest.raises(SandboxError, match="too busy"):
            _run(session, "echo never")
    finally:
        for slot in slots:
            slot.release()
    session.start_timeout = 60.0
    assert _run(session, "echo again").output == "again\n"
    assert _every_place_free(backend)


def test_a_turn_closed_mid_exec_ends_the_call_and_frees_its_places(
    backend: DockerExec, session: ExecSession
) -> None:
    """Closing the turn while a call sleeps ends the call at once; no place of the bound stays held."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(_run, session, "echo up; sleep 120", 300.0)
        time.sleep(1.0)  # the call is under way (or starting): either way closing must end it
        session.close()
        try:
            outcome = running.result(timeout=120)
        except SandboxError:
            pass  # the engine lost the container under the call: said as an error
        else:
            assert outcome.exit_code != 0
    with pytest.raises(SandboxError, match="closed"):
        _run(session, "echo after")
    assert _every_place_free(backend)


def test_many_calls_of_many_turns_at_once_hold_the_bound(backend: DockerExec) -> None:
    """Eight turns calling at once through a bound of 2: every answer right, every place given back."""
    turns = [backend.start(Policy(limits=SMALL_LIMITS)) for _ in range(8)]
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            outputs = list(
                pool.map(lambda pair: _run(pair[1], f"echo {pair[0]}").output, enumerate(turns))
            )
    finally:
        for turn in turns:
            turn.close()
    assert outputs == [f"{n}\n" for n in range(8)]
    assert _every_place_free(backend)


ECHO = ToolSpec.command_tool("echo", "Echo.", ["/bin/sh", "-c", "cat"])


def test_a_turn_outlives_the_thread_that_opened_it(backend: DockerExec) -> None:
    """A turn opened by a thread that has ended is called and closed from another thread."""
    executor = Executor(Registry([ECHO]), sandbox=backend, limits=SMALL_LIMITS)
    opened = []
    opener = threading.Thread(target=lambda: opened.append(executor.turn().__enter__()))
    opener.start()
    opener.join()
    turn = opened[0]
    result = turn.call("echo", {"n": 1})
    assert not result.is_error
    assert '"n": 1' in result.text or '"n":1' in result.text
    turn.__exit__(None, None, None)
    with pytest.raises(TurnClosedError):
        turn.call("echo", {"n": 2})
    assert _every_place_free(backend)

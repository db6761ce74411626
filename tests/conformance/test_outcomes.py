"""Every result says whose failure it was: each ``Outcome`` produced for real on each backend."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from astralvessel import Agent, Executor, Outcome, Registry, ToolError, Turn
from astralvessel._executor._exec import OUTPUT_BYTES
from astralvessel.sandbox import Mount, Sandbox, SandboxSession

from .calls import PYTHON
from .conftest import DECLARED_UNKEPT, TEST_LIMITS, WORKDIR

#: How long the memory and process tests' children hold what they took (the watch samples
#: every 50 ms).
HOLD_S = 6
#: Their hold where the backend declares the memory watch unkept: only the expected failure's cost.
UNKEPT_HOLD_S = 0.5


def _executor(backend: Sandbox, agent_dir: Path, data_dir: Path, **options: object) -> Executor:
    registry = Registry.for_agent(Agent.load(agent_dir))

    @registry.tool
    def broken(reason: str) -> str:
        """A host-side tool whose service is down."""
        raise ToolError(f"the catalogue is down: {reason}")

    settings: dict[str, object] = {"limits": TEST_LIMITS, "timeout_seconds": 30.0}
    settings.update(options)
    return Executor(
        registry,
        sandbox=backend,
        mounts=(Mount.from_pair(WORKDIR, data_dir),),
        **settings,  # type: ignore[arg-type]
    )


@pytest.fixture
def opened(backend: Sandbox, agent_dir: Path, data_dir: Path) -> Iterator[Turn]:
    """A turn of the backend under test whose registry also holds a host tool that raises."""
    with _executor(backend, agent_dir, data_dir) as executor, executor.turn() as turn:
        yield turn


def test_success_is_ok(opened: Turn) -> None:
    """A command that exits 0 is ``ok``, as a call and as an exec."""
    assert opened.call("bash", {"command": "echo fine"}).outcome is Outcome.OK
    assert opened.exec(["/bin/true"]).outcome is Outcome.OK


def test_non_zero_exit_is_failed(opened: Turn) -> None:
    """The command's own non-zero exit is ``failed``, as a call and as an exec."""
    result = opened.call("bash", {"command": "echo no; exit 3"})
    assert (result.is_error, result.outcome) == (True, Outcome.FAILED)
    assert opened.exec(["/bin/sh", "-c", "exit 3"]).outcome is Outcome.FAILED


def test_refused_arguments_are_refused(opened: Turn) -> None:
    """Arguments that fail the schema, and a tool that does not exist, are ``refused``."""
    bad = opened.call("bash", {"command": 5})
    unknown = opened.call("rm_rf", {})
    assert (bad.is_error, bad.outcome) == (True, Outcome.REFUSED)
    assert (unknown.is_error, unknown.outcome) == (True, Outcome.REFUSED)


def test_scope_refusal_is_refused(backend: Sandbox, agent_dir: Path, data_dir: Path) -> None:
    """A tool outside the granted scopes is ``refused``, and nothing ran."""
    executor = _executor(backend, agent_dir, data_dir, scopes=["tools:read"])
    with executor, executor.turn() as turn:
        result = turn.call("bash", {"command": "echo hi"})
    assert (result.is_error, result.outcome, result.backend) == (True, Outcome.REFUSED, None)


def test_timeout_is_timed_out(backend: Sandbox, agent_dir: Path, data_dir: Path) -> None:
    """A call and an exec past their timeouts are ``timed_out``, not ``failed``."""
    executor = _executor(backend, agent_dir, data_dir, timeout_seconds=1.0)
    with executor, executor.turn() as turn:
        call = turn.call("bash", {"command": "sleep 30"})
        run = turn.exec(["/bin/sleep", "30"], timeout=1.0)
    assert (call.is_error, call.outcome) == (True, Outcome.TIMED_OUT)
    assert run.outcome is Outcome.TIMED_OUT


def test_output_cut_is_limit(backend: Sandbox, agent_dir: Path, data_dir: Path) -> None:
    """Output cut at the turn's bound is ``limit``, even from a command that exited 0; so is
    an exec's stream past its bound."""
    executor = _executor(backend, agent_dir, data_dir, output_chars=100)
    with executor, executor.turn() as turn:
        result = turn.call("bash", {"command": "head -c 5000 /dev/zero | tr '\\0' x"})
        run = turn.exec(["/bin/sh", "-c", f"head -c {OUTPUT_BYTES + 4096} /dev/zero"])
    assert result.dropped_chars > 0
    assert (result.is_error, result.outcome) == (False, Outcome.LIMIT)
    assert (run.returncode, run.truncated, len(run.stdout)) == (0, True, OUTPUT_BYTES)
    assert run.outcome is Outcome.LIMIT


def test_memory_stop_is_limit(
    backend: Sandbox, agent_dir: Path, data_dir: Path, request: pytest.FixtureRequest
) -> None:
    """A call and an exec the turn's memory bound stopped are ``limit``."""
    limits = attrs.evolve(TEST_LIMITS, disk_mb=512)
    unkept = request.node.originalname in DECLARED_UNKEPT.get(backend.name, {})
    code = _together(limits.memory_mb, UNKEPT_HOLD_S if unkept else HOLD_S)
    executor = _executor(backend, agent_dir, data_dir, limits=limits, timeout_seconds=40.0)
    with executor, executor.turn() as turn:
        call = turn.call("bash", {"command": f"{PYTHON} -c '{code}'"})
        run = turn.exec([PYTHON, "-c", code])
    assert "[memory limit:" in call.text, call.text
    assert (call.is_error, call.outcome) == (True, Outcome.LIMIT)
    assert run.outcome is Outcome.LIMIT


def test_a_full_disk_is_limit(opened: Turn) -> None:
    """A call and an exec that fill the workspace are ``limit``; a call that finds it full
    and leaves it so did not fill it, and is judged by its own exit."""
    # Two files of five eighths each: the second meets the full disk (ENOSPC), not the
    # per-file bound (EFBIG at disk_mb, which a lone file reaches as the disk fills).
    half = (TEST_LIMITS.disk_mb * 5 // 8) << 20
    fill = " && ".join(f"head -c {half} /dev/zero > /workspace/{n}" for n in "ab")
    call = opened.call("bash", {"command": fill})
    after = opened.call("bash", {"command": "ls /workspace"})
    opened.call("bash", {"command": "rm /workspace/a /workspace/b"})
    run = opened.exec(["/bin/sh", "-c", fill])
    opened.call("bash", {"command": "rm /workspace/a /workspace/b"})
    # Empty files until the workspace has no inode left: its other bound.
    inodes = opened.exec([PYTHON, "-c", _EMPTY_FILES])
    assert "No space left on device" in call.text, call.text
    assert (call.is_error, call.outcome) == (True, Outcome.LIMIT)
    assert after.outcome is Outcome.OK
    assert run.outcome is Outcome.LIMIT
    assert b"No space left on device" in inodes.stderr, inodes.stderr
    assert (inodes.returncode, inodes.outcome) == (1, Outcome.LIMIT)


#: Python code that makes empty files in the workspace until one cannot be made.
_EMPTY_FILES = """
import itertools
for n in itertools.count():
    open(f"/workspace/e{n}", "w").close()
"""


def test_processes_at_their_bound_are_limit(
    backend: Sandbox, agent_dir: Path, data_dir: Path, request: pytest.FixtureRequest
) -> None:
    """A call and an exec whose forks the process bound refused (``EAGAIN``) are ``limit``."""
    unkept = request.node.originalname in DECLARED_UNKEPT.get(backend.name, {})
    code = _fork_until_refused(UNKEPT_HOLD_S if unkept else HOLD_S)
    executor = _executor(backend, agent_dir, data_dir, timeout_seconds=40.0)
    with executor, executor.turn() as turn:
        call = turn.call("bash", {"command": f"{PYTHON} -c '{code}'"})
        run = turn.exec([PYTHON, "-c", code])
    assert "refused after" in call.text, call.text
    assert (call.is_error, call.outcome) == (True, Outcome.LIMIT)
    assert run.outcome is Outcome.LIMIT


def test_sandbox_killed_from_outside_is_sandbox_lost(opened: Turn) -> None:
    """A call whose sandbox was killed from outside is ``sandbox_lost``; the next call is ``ok``."""
    assert opened.call("bash", {"command": "echo up"}).outcome is Outcome.OK
    _kill_from_outside(opened.session)
    died = opened.call("bash", {"command": "echo again"})
    after = opened.call("bash", {"command": "echo fresh"})
    assert "the sandbox died" in died.text
    assert (died.is_error, died.outcome) == (True, Outcome.SANDBOX_LOST)
    assert after.outcome is Outcome.OK


def test_host_tool_that_raises_is_host_error(opened: Turn) -> None:
    """A host-side Python tool that raises is ``host_error``; its message is the text."""
    result = opened.call("broken", {"reason": "maintenance"})
    assert result.text == "the catalogue is down: maintenance"
    assert (result.is_error, result.outcome) == (True, Outcome.HOST_ERROR)


def _together(memory_mb: int, hold_s: float) -> str:
    """Python code (no single quote) whose five children together hold 1.5 times ``memory_mb``."""
    each = memory_mb * 3 // 10
    return textwrap.dedent(
        f"""
        import os, time
        for _ in range(5):
            if os.fork() == 0:
                held = [bytearray(8 << 20) for _ in range({each} // 8)]
                time.sleep({hold_s})
                os._exit(0)
        os.wait()
        print("every child ended on its own")
        """
    )


def _fork_until_refused(hold_s: float) -> str:
    """Python code (no single quote) that forks children holding on for ``hold_s`` until the
    kernel refuses a fork, then waits for them and exits 1."""
    return textwrap.dedent(
        f"""
        import os, sys, time
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep({hold_s})
                    os._exit(0)
                children += 1
        except BlockingIOError as exc:
            print("fork refused after", children, "children:", exc)
        while children:
            os.wait()
            children -= 1
        sys.exit(1)
        """
    )


def _kill_from_outside(session: SandboxSession) -> None:
    """SIGKILL the whole sandbox as an operator or the kernel would: its container, or the
    backend's process group (bubblewrap, nsjail)."""
    container = getattr(session, "container_id", None) or getattr(
        getattr(session, "_channel", None), "container_id", None
    )
    if container is not None:
        import docker

        client = docker.from_env(version="auto")
        try:
            client.api.kill(container)
        finally:
            client.close()
        return
    process = session._channel.process  # type: ignore[attr-defined]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)

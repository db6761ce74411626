"""inspect's ``exec_remote()`` on the provider: streaming through inspect's own tool server.

``SandboxEnvironment.exec_remote`` injects inspect's sandbox tools into the
sandbox and drives a process through their server (start, poll, kill), as
``bash_session()`` does. The server listens on a unix socket and runs as root
under /var/tmp, so the sandbox opts into ``tool_servers``, ``writable_root``
and ``root_identity``. Each test runs a real process on every backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from inspect_ai.util import (
    ExecCompleted,
    ExecRemoteAwaitableOptions,
    ExecStderr,
    ExecStdout,
    SandboxEnvironment,
)
from inspect_ai.util._sandbox.events import SandboxEnvironmentProxy

from astralvessel.integrations.inspect_ai import VesselSandboxConfig, VesselSandboxEnvironment

from .conftest import BACKENDS

# One of inspect's own warnings, which the suite's filter would raise as an error (as in
# test_eval): its retry helper passes tenacity a deprecated argument. No eval runs here, so
# no sample leaves inspect's hook-event stream for the collector.
# One sandbox per backend for the module: inspect injects its tools (a large binary) into
# each sandbox once, which is most of a test's time.
pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def env(request: pytest.FixtureRequest) -> AsyncIterator[SandboxEnvironment]:
    """One sample's sandbox with the relaxations inspect's tool server needs, behind inspect's
    own proxy, as ``sandbox()`` hands it to a solver in an eval."""
    task = f"exec-remote-{request.param}"
    config = VesselSandboxConfig(
        backend=request.param, writable_root=True, root_identity=True, tool_servers=True
    )
    await VesselSandboxEnvironment.task_init(task, config)
    environments = await VesselSandboxEnvironment.sample_init(task, config, {})
    try:
        yield SandboxEnvironmentProxy(environments["default"])
    finally:
        await VesselSandboxEnvironment.sample_cleanup(task, config, environments, False)
        await VesselSandboxEnvironment.task_cleanup(task, config, True)


async def test_streaming_yields_stdout_stderr_and_the_exit_code(env: SandboxEnvironment):
    """A streamed process's output arrives as stdout and stderr events, then its exit code."""
    script = "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 3"
    process = await env.exec_remote(["sh", "-c", script])
    out, err, codes = [], [], []
    async for event in process:
        if isinstance(event, ExecStdout):
            out.append(event.data)
        elif isinstance(event, ExecStderr):
            err.append(event.data)
        elif isinstance(event, ExecCompleted):
            codes.append(event.exit_code)
    assert "".join(out) == "one\nthree\n"
    assert "".join(err) == "two\n"
    assert codes == [3]


async def test_awaitable_returns_the_whole_result(env: SandboxEnvironment):
    """exec_remote(stream=False) returns the process's output and exit code at once."""
    result = await env.exec_remote(
        ["sh", "-c", "printf 'a%.0s' $(seq 1 5000); exit 0"], stream=False
    )
    assert result.success
    assert result.stdout == "a" * 5000


async def test_kill_ends_a_streamed_process(env: SandboxEnvironment):
    """kill() ends a long-running streamed process: nothing of it is left in the sandbox."""
    process = await env.exec_remote(["sh", "-c", "echo started; exec sleep 300"])
    async for event in process:
        if isinstance(event, ExecStdout) and "started" in event.data:
            break
    await process.kill()
    listing = await env.exec(["sh", "-c", "ps -eo args | grep -c '[s]leep 300' || true"])
    assert listing.stdout.strip() == "0", listing.stdout


async def test_input_reaches_the_process(env: SandboxEnvironment):
    """The input given to exec_remote is the process's standard input."""
    result = await env.exec_remote(
        ["tr", "a-z", "A-Z"], ExecRemoteAwaitableOptions(input="streamed\n"), stream=False
    )
    assert result.stdout == "STREAMED\n"

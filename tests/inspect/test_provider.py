"""What the provider adds to the turn: inspect's errors, its tool server, many commands at once."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import anyio
import pytest
from inspect_ai.util import (
    SandboxEnvironment,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
)
from inspect_ai.util._sandbox._cli import SANDBOX_CLI

from astralvessel.integrations.inspect_ai import VesselSandboxConfig, VesselSandboxEnvironment

from ..conformance.calls import host_processes_with, wait_until_gone
from ..core.test_executor import kill_server

CONFIG = VesselSandboxConfig(backend="bubblewrap")


@pytest.fixture
async def sandbox_env() -> AsyncIterator[SandboxEnvironment]:
    """One sample's sandbox on bubblewrap, opened and closed as inspect does."""
    await VesselSandboxEnvironment.task_init("provider", CONFIG)
    environments = await VesselSandboxEnvironment.sample_init("provider", CONFIG, {})
    try:
        yield environments["default"]
    finally:
        await VesselSandboxEnvironment.sample_cleanup("provider", CONFIG, environments, False)
        await VesselSandboxEnvironment.task_cleanup("provider", CONFIG, True)


@pytest.mark.parametrize("user", ["root", "0", "nobody", "", "../../etc"])
async def test_other_users_are_unsupported(sandbox_env: SandboxEnvironment, user: str) -> None:
    """Any ``user=`` is inspect's SandboxUserUnsupportedError, and nothing runs."""
    with pytest.raises(SandboxUserUnsupportedError, match="one identity"):
        await sandbox_env.exec(["touch", "ran"], user=user)
    assert "ran" not in (await sandbox_env.exec(["ls"])).stdout


async def test_tool_server_start_is_answered_not_run(sandbox_env: SandboxEnvironment) -> None:
    """Without ``tool_servers``, inspect's tool-server start succeeds without running, and says
    why in its stderr."""
    result = await sandbox_env.exec([SANDBOX_CLI, "start-server"])
    assert result.success
    assert "was not started" in result.stderr
    # Any other use of the tools' launcher runs as a command: here it is not installed.
    other = await sandbox_env.exec([SANDBOX_CLI, "stop-server"])
    assert other.returncode == 127


async def test_dead_sandbox_is_unavailable_then_fresh(sandbox_env: SandboxEnvironment) -> None:
    """A sandbox that died is SandboxUnavailableError once; the next command runs in a fresh one."""
    turn = sandbox_env.as_type(VesselSandboxEnvironment).turn
    await sandbox_env.write_file("kept.txt", "kept")
    kill_server(turn.session)
    with pytest.raises(SandboxUnavailableError, match="workspace is lost"):
        await sandbox_env.exec(["cat", "kept.txt"])
    again = await sandbox_env.exec(["sh", "-c", "cat kept.txt 2>/dev/null; echo fresh"])
    assert again.stdout == "fresh\n"


async def test_command_running_at_sample_cleanup_is_unavailable(
    sandbox_env: SandboxEnvironment,
) -> None:
    """A command still running when inspect cleans the sample up raises SandboxUnavailableError."""
    marker = f"cleanup-{os.getpid()}-{os.urandom(3).hex()}"
    raised: list[BaseException] = []

    async def run() -> None:
        try:
            await sandbox_env.exec(["sh", "-c", f"sleep 1000; : {marker}", marker])
        except Exception as exc:  # the test checks which
            raised.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        while not host_processes_with(marker):
            await anyio.sleep(0.05)
        await VesselSandboxEnvironment.sample_cleanup(
            "provider", CONFIG, {"default": sandbox_env}, True
        )
    assert [type(exc) for exc in raised] == [SandboxUnavailableError], raised
    assert wait_until_gone(marker) == []


async def test_many_commands_at_once(sandbox_env: SandboxEnvironment) -> None:
    """Sixteen commands of one sample run at once, each with its own output."""
    results: dict[int, str] = {}

    async def one(n: int) -> None:
        result = await sandbox_env.exec(["sh", "-c", f"sleep 0.2; echo {n}"])
        results[n] = result.stdout

    async with anyio.create_task_group() as group:
        for n in range(16):
            group.start_soon(one, n)
    assert results == {n: f"{n}\n" for n in range(16)}


async def test_invalid_utf8_text_read_is_decode_error(sandbox_env: SandboxEnvironment) -> None:
    """Reading bytes that are not UTF-8 as text raises UnicodeDecodeError; as bytes, they come back."""
    await sandbox_env.write_file("blob", b"\xff\xfe\x00")
    with pytest.raises(UnicodeDecodeError):
        await sandbox_env.read_file("blob", text=True)
    assert await sandbox_env.read_file("blob", text=False) == b"\xff\xfe\x00"


@pytest.mark.parametrize("raw", [b"caf\xe9.txt", b"\xff\xfe", b"new\nline", b"\x1b[31mred"])
async def test_file_names_of_any_bytes_reach_the_same_file(
    sandbox_env: SandboxEnvironment, raw: bytes
) -> None:
    """A name given as os.fsdecode gives it is written, read and run on as its very bytes."""
    name = os.fsdecode(raw)
    await sandbox_env.write_file(f"odd/{name}", "kept")
    assert await sandbox_env.read_file(f"odd/{name}") == "kept"
    listed = await sandbox_env.exec(
        [
            "python3",
            "-c",
            "import os; print(os.listdir(b'odd') == [os.fsencode(os.sys.argv[1])])",
            name,
        ]
    )
    assert listed.stdout == "True\n"
    done = await sandbox_env.exec(["cat", f"odd/{name}"])
    assert done.stdout == "kept"


async def test_stray_output_bytes_do_not_cost_the_result(sandbox_env: SandboxEnvironment) -> None:
    """A command printing bytes that are not UTF-8 still returns, with replacement characters."""
    result = await sandbox_env.exec(["printf", "ok\\377\\n"])
    assert result.stdout == "ok\ufffd\n"


async def test_users_under_root_identity() -> None:
    """With root_identity, ``user=`` runs as that user of the sandbox's passwd, all without
    capabilities; an unknown user is a failed result that names it, and nothing runs."""
    config = VesselSandboxConfig(backend="bubblewrap", root_identity=True)
    await VesselSandboxEnvironment.task_init("root", config)
    environments = await VesselSandboxEnvironment.sample_init("root", config, {})
    env = environments["default"]
    try:
        root = await env.exec(["sh", "-c", "id -u; grep CapEff /proc/self/status"], user="root")
        assert root.stdout == "0\nCapEff:\t0000000000000000\n"
        nobody = await env.exec(["sh", "-c", "id -u; grep CapEff /proc/self/status"], user="nobody")
        assert nobody.stdout == "65534\nCapEff:\t0000000000000000\n"
        unknown = await env.exec(["touch", "ran"], user="../../etc")
        assert not unknown.success
        assert "'../../etc'" in unknown.stderr
        assert "ran" not in (await env.exec(["ls"])).stdout
    finally:
        await VesselSandboxEnvironment.sample_cleanup("root", config, environments, False)
        await VesselSandboxEnvironment.task_cleanup("root", config, True)

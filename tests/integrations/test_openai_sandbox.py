"""The Agents SDK's sandbox client on astralvessel turns, on every confined backend.

Each test id names its backend. The first group is adapted from the SDK's own
client tests (openai/openai-agents-python at 7f7a44f8d, MIT licence:
tests/sandbox/test_unix_local.py); the SDK tests that do not apply, and why,
are listed in docs/integrations/openai-agents-sandbox.md. The rest check what
the client promises: the manifest materialised, the policy's refusals raised
as the SDK's own errors before anything runs, and a SandboxAgent run end to
end with the SDK's scripted model.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from agents import RunConfig, Runner
from agents.sandbox import Manifest, SandboxAgent, SandboxPathGrant, SandboxRunConfig
from agents.sandbox.entries import Dir, File, LocalDir, LocalFile, S3Mount
from agents.sandbox.entries.mounts.base import InContainerMountStrategy
from agents.sandbox.entries.mounts.patterns import RcloneMountPattern
from agents.sandbox.errors import (
    ConfigurationError,
    ExecTimeoutError,
    MountConfigError,
    SnapshotNotRestorableError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.session import SandboxSession
from agents.sandbox.snapshot import LocalSnapshotSpec, NoopSnapshotSpec
from agents.sandbox.types import User
from agents.testing import ScriptedModel, assistant_message, function_call

from astralvessel import Executor, Registry, UsageError
from astralvessel.integrations.openai_agents import (
    VesselSandboxClient,
    VesselSandboxClientOptions,
)

#: The confined backends the client runs on; one that cannot run here fails, never skips.
CLIENT_BACKENDS = ["bubblewrap", "nsjail", "docker"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host folder the executors mount read-only at /data."""
    folder = tmp_path_factory.mktemp("shared")
    (folder / "fact.txt").write_text("otters hold hands\n")
    (folder / "tree" / "sub").mkdir(parents=True)
    (folder / "tree" / "sub" / "leaf.txt").write_text("leaf\n")
    for path in (folder, folder / "tree", folder / "tree" / "sub"):
        path.chmod(0o755)
    return folder


@pytest.fixture(scope="module", params=CLIENT_BACKENDS)
def client(request: pytest.FixtureRequest, shared: Path) -> Iterator[VesselSandboxClient]:
    """The client on one backend's executor, which mounts ``shared`` at /data."""
    executor = Executor(Registry(), sandbox=request.param, mounts={"/data": shared})
    try:
        yield VesselSandboxClient(executor)
    finally:
        executor.close()


@pytest.fixture
async def session(client: VesselSandboxClient) -> AsyncIterator[SandboxSession]:
    """A started session with an empty manifest, deleted after the test."""
    session = await client.create(options=None)
    try:
        async with session:
            yield session
    finally:
        await client.delete(session)


# -- adapted from the SDK's tests/sandbox/test_unix_local.py --------------------------------


async def test_rejects_host_path_before_creating_workspace(
    client: VesselSandboxClient, tmp_path: Path
) -> None:
    """A host path grant the policy does not mount is refused before any sandbox starts."""
    manifest = Manifest(
        extra_path_grants=(SandboxPathGrant(path="/mnt/shared-data", host_path=str(tmp_path)),)
    )
    with pytest.raises(MountConfigError, match="does not mount"):
        await client.create(manifest=manifest, snapshot=None, options=None)


# -- the client's own promises ---------------------------------------------------------------


async def test_exec_read_write_running(session: SandboxSession) -> None:
    """exec, write, read and running are the turn's, in its workspace."""
    assert await session.running()
    await session.write(Path("hello.py"), io.BytesIO(b"print('hi from ' + 'python')\n"))
    result = await session.exec("python3 hello.py > out.txt && cat out.txt")
    assert (result.exit_code, result.stdout) == (0, b"hi from python\n")
    assert (await session.read(Path("/workspace/out.txt"))).read() == b"hi from python\n"
    who = await session.exec("id", "-u", shell=False)
    assert who.stdout.strip() != b"0"


async def test_manifest_is_materialised(client: VesselSandboxClient, shared: Path) -> None:
    """The manifest's files and folders, inline and from the host, are in the workspace.

    The SDK copies host files only from under a path grant's host folder, here the mount's.
    """
    manifest = Manifest(
        entries={
            "notes.txt": File(content=b"inline\n"),
            "empty": Dir(),
            "copied.txt": LocalFile(src=shared / "fact.txt"),
            "tree": LocalDir(src=shared / "tree"),
        },
        extra_path_grants=(SandboxPathGrant(path="/data", host_path=str(shared), read_only=True),),
    )
    session = await client.create(manifest=manifest, options=VesselSandboxClientOptions())
    try:
        async with session:
            listing = await session.exec("find . -path ./outbox -prune -o -print | sort")
            assert listing.stdout.decode().split() == [
                ".",
                "./copied.txt",
                "./empty",
                "./notes.txt",
                "./tree",
                "./tree/sub",
                "./tree/sub/leaf.txt",
            ]
            assert (await session.read(Path("copied.txt"))).read() == b"otters hold hands\n"
            assert (await session.read(Path("/data/fact.txt"))).read() == b"otters hold hands\n"
    finally:
        await client.delete(session)


async def test_read_of_a_missing_file_is_the_sdks_not_found(session: SandboxSession) -> None:
    """A missing file raises the SDK's WorkspaceReadNotFoundError."""
    with pytest.raises(WorkspaceReadNotFoundError):
        await session.read(Path("missing.txt"))


async def test_write_the_policy_refuses_is_the_sdks_write_error(
    client: VesselSandboxClient, shared: Path
) -> None:
    """A write into a read-only mount raises the SDK's write error, also through a link."""
    manifest = Manifest(
        extra_path_grants=(SandboxPathGrant(path="/data", host_path=str(shared), read_only=True),)
    )
    session = await client.create(manifest=manifest, options=None)
    try:
        async with session:
            with pytest.raises(WorkspaceArchiveWriteError):  # the SDK's own check
                await session.write(Path("/data/planted.txt"), io.BytesIO(b"x"))
            # A link the SDK's lexical check lets through: the policy refuses underneath.
            await session.exec("ln", "-s", "/data", "/workspace/linked", shell=False)
            with pytest.raises(WorkspaceArchiveWriteError) as refused:
                await session.write(Path("linked/planted.txt"), io.BytesIO(b"x"))
            assert isinstance(refused.value.__cause__, PermissionError)
            assert not (shared / "planted.txt").exists()
    finally:
        await client.delete(session)


async def test_timeout_is_the_sdks_timeout(session: SandboxSession) -> None:
    """A command past its timeout is killed and raises the SDK's ExecTimeoutError."""
    with pytest.raises(ExecTimeoutError):
        await session.exec("sleep 30", timeout=0.5)


async def test_no_network_the_policy_does_not_list(session: SandboxSession) -> None:
    """A command cannot open a connection the policy does not allow."""
    probe = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=5)"
    result = await session.exec("python3", "-c", probe, shell=False)
    assert result.exit_code == 1
    assert b"Error" in result.stderr


async def test_a_user_needs_the_root_identity(session: SandboxSession) -> None:
    """Running as a user without the root identity is the host's mistake: UsageError."""
    with pytest.raises(UsageError, match="root_identity"):
        await session.exec("whoami", user=User(name="sandbox-user"))


async def test_delete_ends_the_sandbox(client: VesselSandboxClient) -> None:
    """delete ends the session's turn: the session no longer runs."""
    session = await client.create(options=None)
    await session.start()
    await client.delete(session)
    assert not await session.running()


@pytest.mark.parametrize(
    ("manifest", "error", "match"),
    [
        pytest.param(Manifest(root="/srv/app"), ConfigurationError, "root", id="root"),
        pytest.param(
            Manifest(
                entries={
                    "bucket": S3Mount(
                        bucket="b",
                        mount_strategy=InContainerMountStrategy(pattern=RcloneMountPattern()),
                    )
                }
            ),
            MountConfigError,
            "no mount tool",
            id="remote-mount",
        ),
        pytest.param(
            Manifest(
                extra_path_grants=(
                    SandboxPathGrant(path="/data", host_path="/etc", read_only=True),
                )
            ),
            MountConfigError,
            "does not mount",
            id="other-host-path",
        ),
        pytest.param(
            Manifest(users=[User(name="alice")]), ConfigurationError, "root identity", id="users"
        ),
    ],
)
async def test_what_the_policy_refuses_is_refused_before_anything_runs(
    client: VesselSandboxClient, manifest: Manifest, error: type[Exception], match: str
) -> None:
    """A manifest asking for what the policy refuses fails at create with the SDK's error."""
    with pytest.raises(error, match=match):
        await client.create(manifest=manifest, options=None)


async def test_snapshots_are_refused_until_turn_snapshots(
    client: VesselSandboxClient, tmp_path: Path
) -> None:
    """A persisting snapshot is refused at create, and resume with it, naming the way out."""
    with pytest.raises(SnapshotNotRestorableError) as refused:
        await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path), options=None)
    assert "NoopSnapshotSpec" in str(refused.value.context)


async def test_a_sandbox_agent_writes_runs_and_reads(client: VesselSandboxClient) -> None:
    """A SandboxAgent's shell calls run in the turn: write a file, run it, read its output."""
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "printf 'print(6*7)' > a.py"}, call_id="w")],
            [function_call("exec_command", {"cmd": "python3 a.py > out.txt"}, call_id="r")],
            [function_call("exec_command", {"cmd": "cat out.txt"}, call_id="c")],
            [assistant_message("42")],
        ]
    )
    agent = SandboxAgent(name="coder", model=model, instructions="Answer with code.")
    config = RunConfig(sandbox=SandboxRunConfig(client=client, snapshot=NoopSnapshotSpec()))
    result = await Runner.run(agent, "What is 6*7?", run_config=config)
    outputs = [str(item.output) for item in result.new_items if hasattr(item, "output")]
    assert "42" in outputs[-1]
    assert result.final_output == "42"

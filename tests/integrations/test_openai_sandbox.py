"""The Agents SDK's sandbox client on astralvessel turns, on every confined backend.

Each test id names its backend. The first group is adapted from the SDK's own
client tests (openai/openai-agents-python at 7f7a44f8d, MIT licence:
tests/sandbox/test_unix_local.py and test_docker.py); the SDK tests that do not apply, and why,
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
    InvalidManifestPathError,
    MountConfigError,
    SnapshotRestoreError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.session import SandboxSession
from agents.sandbox.snapshot import LocalSnapshotSpec
from agents.sandbox.types import User
from agents.testing import ScriptedModel, assistant_message, function_call

from astralvessel import Executor, Registry, UsageError
from astralvessel.integrations._openai_sandbox import policy_refusal
from astralvessel.integrations.openai_agents import (
    VesselSandboxClient,
    VesselSandboxClientOptions,
)
from astralvessel.sandbox import Mount, Policy

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


@pytest.fixture
async def grant_session(client: VesselSandboxClient, shared: Path) -> AsyncIterator[SandboxSession]:
    """A started session whose manifest grants the mounted /data, read-only."""
    manifest = Manifest(
        extra_path_grants=(SandboxPathGrant(path="/data", host_path=str(shared), read_only=True),)
    )
    session = await client.create(manifest=manifest, options=None)
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


# -- adapted from the SDK's tests/sandbox/test_docker.py: a host-backed fake container there,
# -- a real turn here; the grant's /tmp is /data, the folder this policy mounts


async def test_read_and_write_reject_paths_outside_workspace_root(session: SandboxSession) -> None:
    """A path that climbs out of the root is refused by the SDK's check, read and write."""
    with pytest.raises(InvalidManifestPathError, match="must not escape root"):
        await session.read(Path("../secret.txt"))
    with pytest.raises(InvalidManifestPathError, match="must not escape root"):
        await session.write(Path("../secret.txt"), io.BytesIO(b"nope"))


async def test_read_returns_file_bytes(session: SandboxSession) -> None:
    """read returns the file's bytes exactly, NUL included."""
    await session.exec("printf 'hello\\000world' > hello.bin")
    assert (await session.read(Path("hello.bin"))).read() == b"hello\x00world"


async def test_read_missing_path_raises_not_found_error(session: SandboxSession) -> None:
    """A missing file raises the SDK's WorkspaceReadNotFoundError."""
    with pytest.raises(WorkspaceReadNotFoundError):
        await session.read(Path("missing.txt"))


async def test_read_existing_unreadable_path_raises_archive_error(session: SandboxSession) -> None:
    """A folder where a file was expected raises the SDK's WorkspaceArchiveReadError."""
    await session.exec("mkdir directory")
    with pytest.raises(WorkspaceArchiveReadError):
        await session.read(Path("directory"))


async def test_write_rejects_read_only_extra_path_grant(grant_session: SandboxSession) -> None:
    """A write under a read-only grant is refused with the SDK's context."""
    with pytest.raises(WorkspaceArchiveWriteError) as exc_info:
        await grant_session.write(Path("/data/result.txt"), io.BytesIO(b"scratch output"))
    assert str(exc_info.value) == "failed to write archive for path: /data/result.txt"
    assert exc_info.value.context == {
        "path": "/data/result.txt",
        "reason": "read_only_extra_path_grant",
        "grant_path": "/data",
    }


async def test_write_rejects_workspace_symlink_to_read_only_extra_path_grant(
    grant_session: SandboxSession,
) -> None:
    """A write through a workspace link into a read-only grant is refused, resolved path named."""
    await grant_session.exec("ln", "-s", "/data", "/workspace/tmp-link", shell=False)
    with pytest.raises(WorkspaceArchiveWriteError) as exc_info:
        await grant_session.write(Path("tmp-link/result.txt"), io.BytesIO(b"scratch output"))
    assert str(exc_info.value) == "failed to write archive for path: /workspace/tmp-link/result.txt"
    assert exc_info.value.context == {
        "path": "/workspace/tmp-link/result.txt",
        "reason": "read_only_extra_path_grant",
        "grant_path": "/data",
        "resolved_path": "/data/result.txt",
    }


async def test_rm_unlinks_safe_internal_leaf_symlink(session: SandboxSession) -> None:
    """rm of a link inside the workspace removes the link, not its target."""
    await session.exec("printf hello > target.txt && ln -s target.txt link.txt")
    await session.rm(Path("link.txt"))
    assert (await session.read(Path("target.txt"))).read() == b"hello"
    assert (await session.exec("test -L link.txt")).exit_code == 1


async def test_workspace_file_ops_reject_symlink_escape(session: SandboxSession) -> None:
    """Every file operation through a link out of the workspace is refused."""
    await session.exec("ln", "-s", "/etc", "/workspace/link", shell=False)
    with pytest.raises(InvalidManifestPathError, match="must not escape root"):
        await session.read(Path("link/hostname"))
    with pytest.raises(InvalidManifestPathError, match="must not escape root"):
        await session.write(Path("link/secret.txt"), io.BytesIO(b"overwrite"))
    with pytest.raises(InvalidManifestPathError, match="must not escape root"):
        await session.ls(Path("link"))
    with pytest.raises(InvalidManifestPathError, match="must not escape root"):
        await session.mkdir(Path("link/newdir"), parents=True)
    with pytest.raises(InvalidManifestPathError, match="must not escape root"):
        await session.rm(Path("link/hostname"))


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


async def test_a_grant_does_not_widen_the_policy(client: VesselSandboxClient) -> None:
    """A path grant lets the SDK's checks through; the policy still refuses underneath."""
    manifest = Manifest(extra_path_grants=(SandboxPathGrant(path="/etc"),))
    session = await client.create(manifest=manifest, options=None)
    try:
        async with session:
            with pytest.raises(WorkspaceArchiveWriteError) as refused:
                await session.write(Path("/etc/planted"), io.BytesIO(b"x"))
            assert isinstance(refused.value.__cause__, PermissionError)
            assert (await session.exec("test -e /etc/planted")).exit_code == 1
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


async def test_persist_and_resume_restore_the_workspace(
    client: VesselSandboxClient, tmp_path: Path
) -> None:
    """A session's workspace, persisted as a turn snapshot at stop, comes back on resume."""
    session = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path), options=None)
    async with session:
        await session.write(Path("notes/kept.txt"), io.BytesIO(b"kept across sessions\n"))
    payload = client.serialize_session_state(session.state)
    assert payload["type"] == "astralvessel"
    resumed = await client.resume(client.deserialize_session_state(payload))
    try:
        async with resumed:
            kept = await resumed.read(Path("notes/kept.txt"))
            assert kept.read() == b"kept across sessions\n"
    finally:
        await client.delete(resumed)


async def test_a_tampered_snapshot_is_refused_on_resume(
    client: VesselSandboxClient, tmp_path: Path
) -> None:
    """A persisted workspace changed on disk fails to hydrate with the SDK's restore error."""
    session = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path), options=None)
    async with session:
        await session.write(Path("a.txt"), io.BytesIO(b"a" * 4096))
    (saved,) = tmp_path.glob("*.tar")
    data = bytearray(saved.read_bytes())
    data[data.index(b"a" * 64)] = ord("b")
    saved.write_bytes(bytes(data))
    resumed = await client.resume(
        client.deserialize_session_state(client.serialize_session_state(session.state))
    )
    try:
        with pytest.raises(SnapshotRestoreError):
            await resumed.start()
    finally:
        await client.delete(resumed)


async def test_a_sandbox_agent_writes_runs_and_reads(
    client: VesselSandboxClient, tmp_path: Path
) -> None:
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
    snapshot = LocalSnapshotSpec(base_path=tmp_path)
    config = RunConfig(sandbox=SandboxRunConfig(client=client, snapshot=snapshot))
    result = await Runner.run(agent, "What is 6*7?", run_config=config)
    outputs = [str(item.output) for item in result.new_items if hasattr(item, "output")]
    assert "42" in outputs[-1]
    assert result.final_output == "42"


def test_a_grant_must_match_a_mount_exactly(shared: Path) -> None:
    """A host path grant passes only as the policy mounts it: same folder, target and mode."""
    policy = Policy(mounts=(Mount.from_pair("/data", shared),))

    def refusal(path: str, host: Path, *, read_only: bool) -> Exception | None:
        grant = SandboxPathGrant(path=path, host_path=str(host), read_only=read_only)
        return policy_refusal(Manifest(extra_path_grants=(grant,)), policy)

    assert refusal("/data", shared, read_only=True) is None
    assert isinstance(refusal("/data", shared, read_only=False), MountConfigError)
    assert isinstance(refusal("/elsewhere", shared, read_only=True), MountConfigError)
    assert isinstance(refusal("/data", shared / "tree", read_only=True), MountConfigError)
    assert (
        policy_refusal(Manifest(extra_path_grants=(SandboxPathGrant(path="/x"),)), policy) is None
    )

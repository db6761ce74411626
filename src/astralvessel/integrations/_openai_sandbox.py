"""The OpenAI Agents SDK's sandbox client on astralvessel turns (``agents.sandbox``).

`VesselSandboxClient` is a ``BaseSandboxClient``: ``create`` opens a turn of
the client's executor and checks the SDK's ``Manifest`` against the turn's
policy before anything runs; the session's ``exec``, ``read`` and ``write``
are the turn's ``aexec``, ``aread_file`` and ``awrite_file``, and every other
workspace operation (``ls``, ``mkdir``, ``rm``, ``mv``, applying the manifest's
files and folders) is the SDK's own, built on those three. What the policy
refuses is refused with the SDK's errors, before the sandbox starts: a host
path grant or a remote mount the executor does not mount, a workspace root
other than its workdir, users to provision without the root identity.
``persist_workspace``, ``hydrate_workspace`` and ``resume`` stand on turn
snapshots (``Turn.asnapshot``, ``TurnSnapshot.save`` and ``load``,
``Executor.turn(snapshot=)``). See docs/integrations/openai-agents-sandbox.md.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO, Literal, cast

from agents.sandbox.entries import Mount as SdkMount
from agents.sandbox.errors import (
    ConfigurationError,
    ErrorCode,
    ExecTimeoutError,
    ExecTransportError,
    MountConfigError,
    SnapshotPersistError,
    SnapshotRestoreError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.runtime_helpers import RuntimeHelperScript
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User

from .. import TurnSnapshot
from ..errors import (
    SandboxError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SnapshotError,
    UsageError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from agents.sandbox.session import Instrumentation

    from ..executor import Executor, Turn
    from ..sandbox import Policy

__all__ = ["VesselSandboxClient", "VesselSandboxClientOptions", "VesselSandboxSessionState"]

#: The SDK's name for this backend: the options' and the session state's ``type``.
BACKEND_ID = "astralvessel"


class VesselSandboxClientOptions(BaseSandboxClientOptions):
    """The client's options: none yet, as the executor holds the policy (JSON round-trips)."""

    type: Literal["astralvessel"] = "astralvessel"


class VesselSandboxSessionState(SandboxSessionState):
    """A session's state as the SDK serialises it; ``backend`` names the sandbox that ran it."""

    type: Literal["astralvessel"] = "astralvessel"
    backend: str = ""


def _other_root(manifest: Manifest, policy: Policy) -> Exception | None:
    if PurePosixPath(manifest.root) == policy.workdir:
        return None
    return ConfigurationError(
        message=(
            f"the manifest's root {manifest.root!r} is not the policy's workspace "
            f"{str(policy.workdir)!r}; the workspace is the one writable place"
        ),
        error_code=ErrorCode.SANDBOX_CONFIG_INVALID,
        op="materialize",
        context={"root": manifest.root},
    )


def _unmounted_host_path(manifest: Manifest, policy: Policy) -> Exception | None:
    mounted = {(m.source.resolve(), str(m.target), m.writable) for m in policy.mounts}
    for grant in manifest.extra_path_grants:
        wanted = (
            grant.host_path and Path(grant.host_path).resolve(),
            grant.path,
            not grant.read_only,
        )
        if grant.host_path is not None and wanted not in mounted:
            return MountConfigError(
                message=(
                    f"the policy does not mount {grant.host_path!r} at {grant.path!r}"
                    f"{' writable' if not grant.read_only else ''}; mounts are the host's "
                    "to give: Executor(mounts=...)"
                ),
                context={"path": grant.path},
            )
    return None


def _remote_mount(manifest: Manifest, policy: Policy) -> Exception | None:
    for path, entry in manifest.iter_entries():
        if isinstance(entry, SdkMount):
            return MountConfigError(
                message=(
                    f"the manifest mounts {type(entry).__name__} at {str(path)!r}: the policy "
                    "runs no mount tool and reaches no storage service; mount a host folder "
                    "with Executor(mounts=...) and a path grant instead"
                ),
                context={"path": str(path)},
            )
    return None


def _accounts_without_root(manifest: Manifest, policy: Policy) -> Exception | None:
    if not (manifest.users or manifest.groups) or policy.root_identity:
        return None
    return ConfigurationError(
        message=(
            "the manifest provisions users or groups, which needs the root identity "
            "relaxation (Executor(root_identity=True))"
        ),
        error_code=ErrorCode.SANDBOX_CONFIG_INVALID,
        op="materialize",
        context={"users": [user.name for user in manifest.users]},
    )


#: What a manifest may ask for that the policy refuses: one check each, in order.
REFUSALS: tuple[Callable[[Manifest, Policy], Exception | None], ...] = (
    _other_root,
    _unmounted_host_path,
    _remote_mount,
    _accounts_without_root,
)


def policy_refusal(manifest: Manifest, policy: Policy) -> Exception | None:
    """The SDK error for the first thing in ``manifest`` that ``policy`` refuses, if any."""
    return next((error for check in REFUSALS if (error := check(manifest, policy))), None)


class VesselSandboxSession(BaseSandboxSession):
    """One SDK sandbox session on one astralvessel turn."""

    state: VesselSandboxSessionState

    def __init__(self, *, state: VesselSandboxSessionState, turn: Turn) -> None:
        self.state = state
        self.turn = turn
        self._running = False
        self._helpers: dict[str, RuntimeHelperScript] = {}

    async def _prepare_backend_workspace(self) -> None:
        # The turn's workspace exists from its start; the first exec starts the sandbox.
        await self._exec_internal("true")

    async def _after_start(self) -> None:
        self._running = True

    async def _after_start_failed(self) -> None:
        self._running = False

    async def _shutdown_backend(self) -> None:
        self._running = False
        await self.turn.aclose()

    async def _ensure_runtime_helper_installed(self, helper: RuntimeHelperScript) -> PurePath:
        # The SDK installs its helpers under /tmp, which the policy keeps read-only; each is
        # a shell script, so it runs inline instead (see _inline), installed nowhere.
        self._helpers[str(helper.install_path)] = helper
        return helper.install_path

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        # Resolved in the sandbox, links included, as the SDK's Docker client does: ls, mkdir
        # and rm through a link out of the root and its grants are refused like read and write.
        return await self._validate_remote_path_access(path, for_write=for_write)

    def _inline(self, argv: list[str]) -> list[str]:
        """A helper's command as ``sh -c SCRIPT``, the SDK's other commands as they are."""
        helper = self._helpers.get(argv[0]) if argv else None
        return argv if helper is None else ["sh", "-c", helper.content, argv[0], *argv[1:]]

    async def exec(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
    ) -> ExecResult:
        """Run a command in the turn's sandbox; ``user`` is ``Turn.exec``'s (root identity only)."""
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        name = user.name if isinstance(user, User) else user
        return await self._run(argv, timeout=timeout, user=name or None)

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        return await self._run([str(part) for part in command], timeout=timeout, user=None)

    async def _run(self, argv: list[str], *, timeout: float | None, user: str | None) -> ExecResult:
        try:
            result = await self.turn.aexec(self._inline(argv), timeout=timeout, user=user)
        except SandboxError as error:
            raise ExecTransportError(
                command=argv, cause=error, message=f"the sandbox ended: {error}"
            ) from error
        if result.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(stdout=result.stdout, stderr=result.stderr, exit_code=result.returncode)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        """The file's bytes, read by the sandbox's file worker as the calls' user."""
        target = await self._validate_path_access(path)
        try:
            return io.BytesIO(await self.turn.aread_file(str(target)))
        except SandboxFileNotFoundError as error:
            raise WorkspaceReadNotFoundError(path=target, cause=error) from error
        except (SandboxFileError, UsageError) as error:
            raise WorkspaceArchiveReadError(path=target, cause=error) from error

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        """Replace the file with ``data``'s bytes, in a place the policy lets the calls write."""
        target = await self._validate_path_access(path, for_write=True)
        payload = data.read()
        if not isinstance(payload, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=target, actual_type=type(payload).__name__)
        try:
            await self.turn.awrite_file(str(target), bytes(payload))
        except (SandboxFileError, UsageError) as error:
            raise WorkspaceArchiveWriteError(
                path=target, cause=error, message=f"{target}: {error}"
            ) from error

    async def running(self) -> bool:
        """Whether the session started and has not been shut down."""
        return self._running

    async def persist_workspace(self) -> io.IOBase:
        """The workspace as a turn snapshot's saved form (a pax tar, its manifest first)."""
        root = Path(self.state.manifest.root)
        try:
            snapshot = await self.turn.asnapshot()
            saved = io.BytesIO()
            await asyncio.to_thread(snapshot.save, saved)
        except (SnapshotError, UsageError, SandboxError) as error:
            raise SnapshotPersistError(
                snapshot_id=str(self.state.snapshot.id), path=root, cause=error
            ) from error
        saved.seek(0)
        return saved

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Replace the turn by one opened from the saved snapshot ``data`` (checked whole first)."""
        root = Path(self.state.manifest.root)
        try:
            snapshot = await asyncio.to_thread(TurnSnapshot.load, cast("BinaryIO", data))
        except (SnapshotError, UsageError) as error:
            raise SnapshotRestoreError(
                snapshot_id=str(self.state.snapshot.id), path=root, cause=error
            ) from error
        old, self.turn = self.turn, self.turn.executor.turn(snapshot=snapshot)
        await old.aclose()


class VesselSandboxClient(BaseSandboxClient[VesselSandboxClientOptions | None]):
    """The SDK's sandbox client on ``executor``: a turn per session, under its policy.

    ::

        client = VesselSandboxClient(Executor(Registry(), sandbox="nsjail"))
        run_config = RunConfig(sandbox=SandboxRunConfig(client=client))
    """

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(
        self,
        executor: Executor,
        *,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        self.executor = executor
        self._instrumentation = instrumentation

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: VesselSandboxClientOptions | None = None,
    ) -> SandboxSession:
        """A session on a new turn, once ``manifest`` is checked against the policy."""
        manifest = (
            manifest if manifest is not None else Manifest(root=str(self.executor.policy.workdir))
        )
        refusal = policy_refusal(manifest, self.executor.policy)
        if refusal is not None:
            raise refusal
        self._validate_manifest_for_create(manifest)
        session_id = uuid.uuid4()
        state = VesselSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            backend=self.executor.sandbox.name,
        )
        inner = VesselSandboxSession(state=state, turn=self.executor.turn())
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """End the session's turn: its sandbox and workspace go."""
        inner = session._inner
        if not isinstance(inner, VesselSandboxSession):
            raise TypeError("VesselSandboxClient.delete expects one of its own sessions")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """A session on a new turn, its workspace restored from ``state``'s snapshot at start.

        A turn's sandbox ends with its process, so there is nothing to reattach
        to: the SDK's start hydrates the new turn from the persisted snapshot.
        """
        if not isinstance(state, VesselSandboxSessionState):
            raise TypeError("VesselSandboxClient.resume expects a VesselSandboxSessionState")
        state.assert_path_grants_rebound()
        refusal = policy_refusal(state.manifest, self.executor.policy)
        if refusal is not None:
            raise refusal
        # Nothing of the old workspace is here: the snapshot, if any, is restored in full.
        state.workspace_root_ready = False
        inner = VesselSandboxSession(state=state, turn=self.executor.turn())
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        """The session state the SDK serialised (``serialize_session_state``)."""
        return self._deserialize_session_state_payload(payload, VesselSandboxSessionState)

"""LangChain Deep Agents: a turn's sandbox as a Deep Agents ``SandboxBackendProtocol``.

::

    from deepagents import create_deep_agent
    from astralvessel.integrations.deepagents import VesselSandbox

    with VesselSandbox.open(executor) as backend:       # one turn, one sandbox
        agent = create_deep_agent(model=model, backend=backend)
        agent.invoke({"messages": [("user", "Fix the failing test")]})

`VesselSandbox` is Deep Agents' own ``BaseSandbox`` over the public `Turn`
API: ``execute`` is ``Turn.exec`` of ``bash -c COMMAND`` (stdout, then
stderr, as the hosted providers return them), ``upload_files`` and
``download_files`` are ``Turn.write_file`` and ``Turn.read_file``, and every
other operation (``ls``, ``read``, ``write``, ``edit``, ``grep``, ``glob``,
``delete``) is ``BaseSandbox``'s, a script run through ``execute``, so it
behaves exactly as Deep Agents' reference does. Everything runs under the
turn's policy: the workspace and writable mounts are the only writable
places, and there is no network the policy does not list.

The model's mistakes come back as Deep Agents reports them: a command that
fails is its exit code and output, a file the policy refuses is the
``FileOperationError`` it stands for (``permission_denied``,
``file_not_found``, ``is_directory``, ``invalid_path``), and a sandbox that
died during a command is that command's failed result (the next one starts a
fresh sandbox). The host's mistakes (a closed turn, a backend that cannot
run) raise. Needs the ``deepagents`` extra: ``pip install 'astralvessel[deepagents]'``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .._ground._suggest import missing_extra

try:
    from deepagents.backends.protocol import (
        ExecuteResponse,
        FileDownloadResponse,
        FileOperationError,
        FileUploadResponse,
    )
    from deepagents.backends.sandbox import BaseSandbox
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_extra("the Deep Agents integration", "deepagents", "deepagents") from exc

from ..errors import (
    SandboxError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    UsageError,
)

if TYPE_CHECKING:
    from types import TracebackType

    from ..executor import Executor, Turn
    from ..sandbox import ExecResult

__all__ = ["FILE_ERRORS", "VesselSandbox"]

#: Deep Agents' error code for each of our file refusals (the first class that matches wins).
FILE_ERRORS: tuple[tuple[type[Exception], FileOperationError], ...] = (
    (SandboxFileNotFoundError, "file_not_found"),
    (SandboxIsADirectoryError, "is_directory"),
    (SandboxNotADirectoryError, "invalid_path"),
    (SandboxPermissionError, "permission_denied"),
    # An empty path, a NUL, a name past 255 bytes, a link at a written name: no file is there.
    (UsageError, "invalid_path"),
    (SandboxFileError, "invalid_path"),
)

#: What a command whose sandbox died shows, in place of its output.
SANDBOX_DIED = (
    "the sandbox ended during this command (its files are gone); the next command "
    "starts a fresh one"
)

_ids = itertools.count(1)


def _file_error(error: Exception) -> FileOperationError:
    return next(code for kind, code in FILE_ERRORS if isinstance(error, kind))


def _response(result: ExecResult) -> ExecuteResponse:
    """A finished command as Deep Agents shows it: stdout, then stderr, and the exit code."""
    output = result.stdout.decode("utf-8", "replace")
    if result.stderr:
        stderr = result.stderr.decode("utf-8", "replace")
        output = f"{output}\n{stderr}" if output else stderr
    if result.timed_out:
        output += f"\n[killed: the command ran past its timeout ({result.duration:.0f} s)]"
    return ExecuteResponse(output=output, exit_code=result.returncode, truncated=result.truncated)


class VesselSandbox(BaseSandbox):
    """A Deep Agents sandbox backend on one astralvessel turn: its commands and its files.

    ``env`` is set over every command's clean environment (``Turn.exec``'s
    ``env``) and ``timeout`` is a command's default in seconds (the turn's tool
    timeout when ``None``); a command's own ``timeout`` of 0, Deep Agents'
    "no timeout", is the turn's longest, 24 hours. Build one over a turn the
    host closes, or with `open`, which owns its turn and closes it on `close`
    (or at the end of a ``with`` block).
    """

    def __init__(
        self,
        turn: Turn,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        owns_turn: bool = False,
    ) -> None:
        self.turn = turn
        self.env: Mapping[str, str] = MappingProxyType(dict(env or {}))
        self.timeout = timeout
        self._owns_turn = owns_turn
        self._id = f"astralvessel-{next(_ids)}"

    @classmethod
    def open(
        cls,
        executor: Executor,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> VesselSandbox:
        """A backend on a new turn of ``executor``, closed with the backend."""
        return cls(executor.turn(), env=env, timeout=timeout, owns_turn=True)

    @property
    def id(self) -> str:
        """This backend's name, unique in the process."""
        return self._id

    def _command(self, command: str, timeout: int | None) -> dict[str, Any]:
        seconds = self.timeout if timeout is None else (timeout if timeout > 0 else 24 * 3600.0)
        return {"argv": ["bash", "-c", command], "env": dict(self.env), "timeout": seconds}

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``command`` with ``bash -c`` in the turn's sandbox."""
        try:
            return _response(self.turn.exec(**self._command(command, timeout)))
        except (UsageError, SandboxError) as error:
            return _failed(error)

    async def aexecute(
        self,
        command: str,
        *,
        timeout: int | None = None,
    ) -> ExecuteResponse:
        """Run ``command`` with ``bash -c`` in the turn's sandbox, awaiting it."""
        try:
            return _response(await self.turn.aexec(**self._command(command, timeout)))
        except (UsageError, SandboxError) as error:
            return _failed(error)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each file (making its folders), one response per file in order."""
        responses = []
        for path, content in files:
            try:
                self.turn.write_file(_absolute(path), content)
                responses.append(FileUploadResponse(path=path))
            except (SandboxFileError, UsageError) as error:
                responses.append(FileUploadResponse(path=path, error=_file_error(error)))
        return responses

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each file (making its folders), one response per file in order."""
        responses = []
        for path, content in files:
            try:
                await self.turn.awrite_file(_absolute(path), content)
                responses.append(FileUploadResponse(path=path))
            except (SandboxFileError, UsageError) as error:
                responses.append(FileUploadResponse(path=path, error=_file_error(error)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each file, one response per path in order."""
        responses = []
        for path in paths:
            try:
                content = self.turn.read_file(_absolute(path))
                responses.append(FileDownloadResponse(path=path, content=content))
            except (SandboxFileError, UsageError) as error:
                responses.append(FileDownloadResponse(path=path, error=_file_error(error)))
        return responses

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each file, one response per path in order."""
        responses = []
        for path in paths:
            try:
                content = await self.turn.aread_file(_absolute(path))
                responses.append(FileDownloadResponse(path=path, content=content))
            except (SandboxFileError, UsageError) as error:
                responses.append(FileDownloadResponse(path=path, error=_file_error(error)))
        return responses

    def close(self) -> None:
        """Close the turn if this backend opened it (its sandbox and files go)."""
        if self._owns_turn:
            self.turn.close()

    def __enter__(self) -> VesselSandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(SandboxError):
            self.close()


def _absolute(path: str) -> str:
    """Deep Agents' paths are absolute; a relative one is refused, as the hosted providers do."""
    if not path.startswith("/"):
        raise UsageError(f"{path!r} is not an absolute path")
    return path


def _failed(error: UsageError | SandboxError) -> ExecuteResponse:
    """A command that could not run: the model's (a NUL, an argv too long), or a dead sandbox."""
    if isinstance(error, SandboxError):
        return ExecuteResponse(output=SANDBOX_DIED, exit_code=None)
    return ExecuteResponse(output=str(error), exit_code=126)

"""inspect_ai: astralvessel as an inspect sandbox provider named ``"astralvessel"``.

::

    from inspect_ai import Task
    from inspect_ai.util import SandboxEnvironmentSpec
    from astralvessel.integrations.inspect_ai import VesselSandboxConfig

    Task(..., sandbox=("astralvessel", "path/to/agent"))          # an agent folder
    Task(..., sandbox=SandboxEnvironmentSpec(
        "astralvessel", VesselSandboxConfig(agent="path/to/agent", backend="nsjail")))

inspect finds the provider through the ``inspect_ai`` entry point this package
declares, so installing ``astralvessel[inspect]`` is all a task needs. The
lifetimes map one to one: ``task_init`` loads the agent folder and builds one
``Executor`` per task and configuration (a bad folder or a backend that cannot
run here fails the task before any sample starts), ``sample_init`` opens a
``Turn`` (one sandbox, one workspace) per sample, ``sample_cleanup`` closes it
and ``task_cleanup`` closes the executor. ``exec``, ``read_file`` and
``write_file`` are the turn's ``aexec``, ``aread_file`` and ``awrite_file``,
so every command runs under the agent's policy and limits, exactly like the
agent's own tool calls.

What inspect asks for and what it gets here:

- **Users.** With ``root_identity``, ``user=`` is ``Turn.exec``'s: the command
  sees itself as that user of the sandbox's own ``/etc/passwd`` (``adduser``
  as root, then ``whoami`` as the new user, works), and every user is the
  same host identity, so a user changes what a command sees, never what it
  can reach. An unknown user is a failed result naming it. Without
  ``root_identity`` there is one user, and any ``user=`` is refused with
  ``SandboxUserUnsupportedError``, which inspect reads as "no usable root"
  and answers by running its tools as the default user.
- **Paths.** inspect's tools write under ``/tmp`` and ``/var/tmp``, which
  exist only with ``writable_root`` (``[sandbox] writable_root = true``).
- **Timeouts** raise ``TimeoutError`` after the sandbox killed the command's
  whole process tree; the turn's own tool timeout is the default.
- **Output** beyond inspect's limit (``INSPECT_SANDBOX_MAX_EXEC_OUTPUT_SIZE``,
  10 MiB by default) raises ``OutputLimitExceededError``, as does a read above
  ``INSPECT_SANDBOX_MAX_READ_FILE_SIZE``.
- **inspect's tool server.** ``inspect-sandbox-tools start-server`` runs as
  a detached process (``Turn.start``): it forks the server and exits, and the
  server lives on in the turn, confined, until the sample ends. The server
  listens on a unix socket and gives ``bash_session()`` a terminal, so this
  needs the ``tool_servers`` relaxation (with ``writable_root`` for inspect's
  files); without it the provider answers that one command with a result
  saying so. ``text_editor()`` needs no server. ``web_browser()`` needs a
  browser the sandbox lacks.

Needs the ``inspect`` extra: ``pip install '.[inspect]'``.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from .._ground._suggest import missing_extra

try:
    from inspect_ai.util import (
        ExecResult,
        OutputLimitExceededError,
        SandboxEnvironment,
        SandboxEnvironmentConfigType,
        SandboxEnvironmentLimits,
        SandboxUnavailableError,
        SandboxUserUnsupportedError,
        sandboxenv,
    )
    from inspect_ai.util._sandbox._cli import SANDBOX_CLI
    from pydantic import BaseModel, ConfigDict, field_validator
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise missing_extra("the inspect_ai sandbox provider", "inspect_ai", "inspect") from exc

from .._executor._exec import ARGV_BYTES
from .._ground._suggest import unknown_name as _unknown_name
from ..agent import Agent
from ..errors import FileTooLargeError, SandboxError, TurnClosedError
from ..executor import Executor
from ..registry import Registry
from ..sandbox._discovery import backend_names
from ..sandbox._policy import Promise

if TYPE_CHECKING:
    from ..executor import Turn

__all__ = ["VesselSandboxConfig", "VesselSandboxEnvironment"]

#: The provider's name in ``sandbox=("astralvessel", ...)``.
PROVIDER = "astralvessel"


class VesselSandboxConfig(BaseModel):
    """The provider's configuration: an agent folder, a backend, the promises relaxed.

    A pydantic model, not an attrs value, because inspect stores a sandbox's
    configuration in its eval logs through pydantic and rebuilds it from there
    (``config_deserialize``). Frozen, and checked on every construction path:
    ``agent`` is the agent folder (its ``vessel.toml`` sets the workdir, limits,
    timeouts, network and relaxations; ``None`` runs with the library's
    defaults), ``backend`` a backend name (``None``: the best confined backend
    that can run here), ``relax`` the confinement promises the eval explicitly
    gives up, and ``writable_root`` / ``root_identity`` / ``tool_servers`` the eval relaxations
    (``None``: the folder's ``[sandbox]`` setting).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: str | None = None
    backend: str | None = None
    relax: tuple[str, ...] = ()
    writable_root: bool | None = None
    root_identity: bool | None = None
    tool_servers: bool | None = None

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        if value is not None and value not in backend_names():
            raise ValueError(_unknown_name("backend", value, backend_names()))
        return value

    @field_validator("relax")
    @classmethod
    def _known_promises(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        known = [p.value for p in Promise]
        for name in value:
            if name not in known:
                raise ValueError(_unknown_name("promise", name, known))
        return value

    @classmethod
    def of(cls, config: SandboxEnvironmentConfigType | None) -> VesselSandboxConfig:
        """The configuration inspect hands the provider: ours, a folder path, or none."""
        if config is None:
            return cls()
        if isinstance(config, str):
            return cls(agent=config)
        if isinstance(config, cls):
            return config
        raise TypeError(
            f"the astralvessel sandbox takes an agent folder or a VesselSandboxConfig, "
            f"not {type(config).__name__}"
        )

    def executor(self) -> Executor:
        """A new executor for this configuration; raises ``ConfigError`` for a bad folder."""
        agent = Agent.load(Path(self.agent)) if self.agent is not None else None
        registry = Registry.for_agent(agent) if agent is not None else Registry()
        return Executor(
            registry,
            sandbox=self.backend,
            relax=self.relax,
            writable_root=self.writable_root,
            root_identity=self.root_identity,
            tool_servers=self.tool_servers,
        )


# -- what inspect's calls become -------------------------------------------------------------

#: What ``start-server`` answers without ``tool_servers`` (see the module docstring).
_NO_TOOL_SERVER = (
    "astralvessel: inspect's sandbox-tools server was not started: calls may not open unix "
    "sockets or terminals unless the policy has tool_servers ([sandbox] tool_servers = true). "
    "text_editor() needs no server; bash_session() and streaming exec_remote() do.\n"
)


def _is_tool_server_start(cmd: list[str]) -> bool:
    return cmd == [SANDBOX_CLI, "start-server"]


def _check_user(user: str | None, *, calls_are_root: bool) -> None:
    """Refuse ``user=`` where there is one user: without root_identity."""
    if user is not None and not calls_are_root:
        raise SandboxUserUnsupportedError(
            f"the astralvessel sandbox runs every command as its one identity; it cannot run "
            f"as {user!r} (users need the root identity: root_identity=True)"
        )


def _unrunnable(cmd: list[str]) -> str | None:
    """Why no kernel could take ``cmd`` as a command line, or None.

    inspect's tools put the model's text in a command (``bash -c TEXT``), so it may
    be anything; such a command fails as an ``execve`` refused with ``E2BIG`` does,
    a result the model reads, where the turn's ``UsageError`` (a ``ValueError``)
    would fail the whole sample. A NUL goes on to the turn: its ``UsageError``
    says "embedded null byte", which inspect shows the model as a tool error. (A
    lone surrogate fails the sample in inspect itself, which cannot log it.)
    """
    if not all(isinstance(part, str) for part in cmd):
        return None  # the host's mistake: the turn says what is wrong
    size = sum(len(part.encode("utf-8", "surrogatepass")) + 1 for part in cmd)
    if size > ARGV_BYTES:
        return f"Argument list too long ({size} bytes; at most {ARGV_BYTES})"
    return None


def _text(data: bytes) -> str:
    # Output is the command's, and may be any bytes; a stray byte must not cost the result.
    return data.decode("utf-8", errors="replace")


def _could_not_execute(returncode: int, stderr: bytes) -> bool:
    """Whether the command itself could not be executed (not a program, or not allowed)."""
    return returncode == 126 and b"permission denied" in stderr.lower()


@contextlib.contextmanager
def _unavailable_if_died() -> Iterator[None]:
    """A sandbox that died, or was cleaned up, is inspect's ``SandboxUnavailableError``.

    A sandbox that died the turn has discarded already; its next command starts
    a fresh sandbox (with a fresh workspace), which the message says. A turn
    closed by ``sample_cleanup`` has no next command.
    """
    try:
        yield
    except SandboxError as exc:
        raise SandboxUnavailableError(
            f"the sample's sandbox died and its workspace is lost ({exc}); "
            "the next command starts a fresh one"
        ) from exc
    except TurnClosedError as exc:
        # A task still running when inspect cleaned the sample up: its sandbox is gone for good.
        raise SandboxUnavailableError(
            "the sample's sandbox was cleaned up (sample_cleanup) before this command finished"
        ) from exc


def _shell_status(returncode: int) -> int:
    """The status as a shell reports it: a command ended by signal N is ``128 + N``.

    The turn reports a signal as ``-N``, as ``subprocess`` does; inspect and the
    tools it runs read exit statuses the shell's way (143 for SIGTERM).
    """
    return 128 - returncode if returncode < 0 else returncode


class VesselSandboxEnvironment(SandboxEnvironment):
    """One sample's sandbox: one astralvessel ``Turn``, with inspect's contract on top."""

    #: Executors by (task, configuration), built at ``task_init``, closed at ``task_cleanup``.
    _executors: dict[tuple[str, VesselSandboxConfig], Executor] = {}  # noqa: RUF012

    def __init__(self, turn: Turn) -> None:
        super().__init__()
        self.turn = turn

    # -- lifetimes -------------------------------------------------------------------------

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Load the agent folder and build the task's executor; fail now if it cannot run."""
        cls._executor(task_name, config)

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        """One turn (one sandbox, one workspace) for the sample."""
        turn = cls._executor(task_name, config).turn()
        return {"default": cls(turn)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """End each turn: everything in its sandbox is killed and its workspace removed."""
        for environment in environments.values():
            await environment.as_type(cls).turn.aclose()

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        """Close the task's executor (its warm sandboxes, its temporary outbox)."""
        executor = cls._executors.pop((task_name, VesselSandboxConfig.of(config)), None)
        if executor is not None:
            await executor.aclose()

    @classmethod
    def config_deserialize(cls, config: dict[str, object]) -> BaseModel:
        """Rebuild the configuration inspect stored in an eval log."""
        return VesselSandboxConfig.model_validate(config)

    @classmethod
    def _executor(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> Executor:
        key = (task_name, VesselSandboxConfig.of(config))
        executor = cls._executors.get(key)
        if executor is None:
            executor = cls._executors[key] = key[1].executor()
        return executor

    # -- commands and files ----------------------------------------------------------------

    async def exec(  # noqa: PLR0917 - inspect's signature, positional as inspect calls it
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` in the sample's sandbox; see the module docstring for the mapping."""
        _check_user(user, calls_are_root=self.turn.executor.policy.root_identity)
        if _is_tool_server_start(cmd):
            return await self._start_tool_server(cmd, input, cwd, env, timeout)
        why = _unrunnable(cmd)
        if why is not None:
            # The status and words of a command the server's init could not execve.
            stderr = f"astralvessel: cannot run {cmd[0][:100]!r}: {why}\n"
            return ExecResult(success=False, returncode=126, stdout="", stderr=stderr)
        with _unavailable_if_died():
            result = await self.turn.aexec(
                cmd, input=input, cwd=cwd, env=env, timeout=timeout, user=user
            )
        if result.timed_out:
            error = TimeoutError(f"command timed out after {timeout} seconds: {cmd[:1]}")
            error.truncated_output = _text(result.stdout + result.stderr)  # type: ignore[attr-defined]
            raise error
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        if result.truncated or max(len(result.stdout), len(result.stderr)) > limit:
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                truncated_output=_text(result.stdout[:limit]),
            )
        if _could_not_execute(result.returncode, result.stderr):
            raise PermissionError(
                errno.EACCES, f"cannot execute: {_text(result.stderr).strip()}", cmd[0]
            )
        status = _shell_status(result.returncode)
        return ExecResult(
            success=status == 0,
            returncode=status,
            stdout=_text(result.stdout),
            stderr=_text(result.stderr),
        )

    async def _start_tool_server(
        self,
        cmd: list[str],
        input: str | bytes | None,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout: int | None,
    ) -> ExecResult[str]:
        """``start-server``: a detached process (``Turn.start``) with ``tool_servers``.

        The command forks the server and exits once it answers; the server lives
        on in the turn, confined, until the sample's turn closes. Without
        ``tool_servers`` it could not listen on its socket or open a terminal, so
        the provider answers with a result that says so.
        """
        if not self.turn.executor.policy.tool_servers:
            return ExecResult(success=True, returncode=0, stdout="", stderr=_NO_TOOL_SERVER)
        with _unavailable_if_died():
            server = await self.turn.astart(cmd, input=input, cwd=cwd, env=env)
            wait = timeout or self.turn.executor.timeout_seconds
            try:
                result = await server.aresult(timeout=wait)
            except TimeoutError:
                server.kill()
                raise TimeoutError(f"command timed out after {wait} seconds: {cmd[:1]}") from None
        status = _shell_status(result.returncode)
        # The log holds stdout and stderr together; inspect reports stderr on failure.
        return ExecResult(
            success=status == 0, returncode=status, stdout="", stderr=_text(result.stdout)
        )

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write ``file`` (relative to the workdir), making its folders as needed."""
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        with _unavailable_if_died():
            await self.turn.awrite_file(file, data)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """Read ``file``; text is UTF-8 with its newlines kept as they are."""
        try:
            with _unavailable_if_died():
                data = await self.turn.aread_file(file)
        except FileTooLargeError:
            data = None
        if data is None or len(data) > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            # The contents may be large and binary: inspect's own providers leave them out too.
            raise OutputLimitExceededError(
                limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            )
        return data.decode("utf-8") if text else data

    def default_polling_interval(self) -> float:
        """Commands here start in milliseconds, so poll as often as inspect's local sandbox."""
        return 0.2


#: Registered under inspect's registry when inspect loads this module (its entry point).
sandboxenv(name=PROVIDER)(VesselSandboxEnvironment)

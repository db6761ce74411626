"""What the executor and a turn's session share: requests, outcomes, the session API.

``SandboxSession`` is the API the executor calls for one turn: ``run`` (a
command: one merged text stream and outbox files), ``exec`` (a host's command:
stdout and stderr apart, as bytes) and ``fs`` (one file primitive: read or
write a byte range, list a folder, or render a *view* of the sandbox's files
for a model: ``lines``, ``find``, ``entries``), each with an async twin. No
tool's name is part of it: the built-ins choose their view in ``builtins``.
The library implements it once, in ``_session.ServerSession``, over a
``Channel`` a backend opens (see ``_base.Sandbox``); the values here travel
between the two.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal, Protocol

import attrs
from typing_extensions import Self

from .._ground._aio import wait_future
from .._ground._outcome import Outcome, decide
from ..errors import BackendUnavailableError
from ._policy import Policy, Promise

__all__ = [
    "BackendReport",
    "Channel",
    "DetachRequest",
    "DetachedProcess",
    "ExecRequest",
    "ExecResult",
    "FileOutcome",
    "FsReply",
    "FsRequest",
    "LayerLost",
    "MemoryStop",
    "OutboxFile",
    "RunOutcome",
    "RunRequest",
    "SandboxSession",
]


@attrs.frozen(kw_only=True)
class BackendReport:
    """What ``doctor`` says of one backend on this host."""

    name: str
    available: bool
    reason: str = ""
    binary: str | None = None
    enforced: frozenset[Promise] = frozenset()
    #: Promises this backend cannot keep here, each with why.
    unenforced: Mapping[Promise, str] = attrs.field(factory=dict)
    details: Mapping[str, str] = attrs.field(factory=dict)
    #: Each limit (memory, disk, inodes, processes, open files) and what holds it here.
    mechanisms: Mapping[str, str] = attrs.field(factory=dict)


def _str_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


@attrs.frozen(kw_only=True)
class RunRequest:
    """One confined call: an argv run in the turn's sandbox with the policy's confinement."""

    argv: tuple[str, ...] = attrs.field(converter=_str_tuple)
    stdin: bytes = b""
    timeout: float
    #: Characters of combined output kept; the rest is counted, not kept.
    output_chars: int
    #: Sandbox path of the working directory; ``None`` means the policy's workdir.
    cwd: str | None = None


def _env_map(value: Mapping[str, str]) -> Mapping[str, str]:
    return dict(value)


#: The highest uid or gid a user namespace can map ((uid_t) -1 means "no id").
MAX_ID = 0xFFFFFFFE


def _optional_ids(_inst: object, _attr: object, value: tuple[int, int] | None) -> None:
    if value is None:
        return
    ids: object = value
    if not (
        isinstance(ids, tuple)
        and len(ids) == 2
        and all(type(v) is int and 0 <= v <= MAX_ID for v in ids)
    ):
        raise ValueError(f"user must be (uid, gid), each 0 to {MAX_ID}, not {value!r}")


@attrs.frozen(kw_only=True)
class ExecRequest:
    """A host's command in the turn's sandbox: confined like a call, its streams apart.

    Built and checked by ``Turn.exec`` (see ``astralvessel._executor._exec``); the session
    only carries it.
    """

    argv: tuple[str, ...] = attrs.field(converter=_str_tuple)
    stdin: bytes = b""
    timeout: float
    #: Bytes of each stream kept; the rest is counted, not kept.
    output_bytes: int
    #: Sandbox path of the working directory; ``None`` means the policy's workdir.
    cwd: str | None = None
    #: Variables set over the call's clean environment.
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_env_map)
    #: The uid and gid the command sees, resolved in the sandbox's own /etc/passwd
    #: (``Turn.exec(user=)``, under ``root_identity``); None: the turn's own. Every
    #: user of a turn is the same host identity: the ids change what the command
    #: sees, never what it can reach.
    user: tuple[int, int] | None = attrs.field(default=None, validator=_optional_ids)


@attrs.frozen(kw_only=True)
class DetachRequest:
    """A host's detached process in the turn's sandbox: confined like a call, it lives on
    after its command exits for as long as anything it started runs, until the turn ends.

    Built and checked by ``Turn.start`` (see ``astralvessel._executor._exec``); the session
    only carries it.
    """

    argv: tuple[str, ...] = attrs.field(converter=_str_tuple)
    stdin: bytes = b""
    #: Seconds before its whole namespace is killed; ``None``: until the turn ends.
    timeout: float | None = None
    #: Characters of its merged stdout and stderr kept (the log); the rest is dropped.
    log_chars: int
    cwd: str | None = None
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_env_map)


_nonneg = attrs.validators.ge(0)


@attrs.frozen(kw_only=True)
class ExecResult:
    """What a command run with ``Turn.exec`` did: its exit status and its two streams.

    ``returncode`` is the command's exit code, ``-N`` if a signal N ended it,
    and ``-9`` when it ran past its timeout (``timed_out``) and was killed with
    its whole process tree. ``stdout`` and ``stderr`` are the bytes it wrote,
    each cut at the per-stream bound (``truncated`` says one was cut).
    """

    returncode: int = attrs.field(validator=attrs.validators.instance_of(int))
    stdout: bytes = attrs.field(default=b"", validator=attrs.validators.instance_of(bytes))
    stderr: bytes = attrs.field(default=b"", validator=attrs.validators.instance_of(bytes))
    timed_out: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    truncated: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    duration: float = attrs.field(default=0.0, converter=float, validator=attrs.validators.ge(0.0))
    #: Whether a bound of the turn stopped the command: its memory (its stderr says so),
    #: its processes at their limit or the workspace it filled (its own errors say so).
    stopped_by_limit: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool)
    )
    #: What stopped the command for memory (the watch, then the kernel), as facts: the
    #: turn that returns the result has ended ``stderr`` with their notes.
    memory: tuple[MemoryStop, ...] = ()

    @property
    def success(self) -> bool:
        """Whether the command exited with code 0."""
        return self.returncode == 0 and not self.timed_out

    @property
    def outcome(self) -> Outcome:
        """``ok``, ``failed``, ``timed_out`` or ``limit`` (a stop or a cut stream)."""
        return decide(
            timed_out=self.timed_out,
            limit=self.stopped_by_limit or self.truncated,
            failed=self.returncode != 0,
        )


def _copy_outcome(
    done: concurrent.futures.Future[ExecResult],
    copy: concurrent.futures.Future[ExecResult],
    finish: Callable[[ExecResult], ExecResult] = lambda result: result,
) -> None:
    error = done.exception()
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # the wait was cancelled
        if error is not None:
            copy.set_exception(error)
        else:
            copy.set_result(finish(done.result()))


class DetachedProcess:
    """A process ``Turn.start`` started: it runs in the turn's sandbox until it and
    everything it started end, or the turn closes.

    Shaped like ``concurrent.futures.Future`` over the command's ``ExecResult``:
    ``poll`` (the exit code, or ``None`` while the command runs), ``result`` and
    ``aresult`` (wait for the command's exit; ``TimeoutError`` past ``timeout``),
    ``kill`` (the whole namespace: the command and whatever it left running).
    The result's ``stdout`` is the command's log: its stdout and stderr merged,
    the first ``LOG_BYTES`` kept (``truncated`` says more came); ``stderr`` is
    empty. A daemon the command forked outlives the command's exit: ``result``
    then returns while the daemon keeps running, confined, until the turn ends.
    """

    def __init__(
        self,
        argv: tuple[str, ...],
        future: concurrent.futures.Future[ExecResult],
        kill: Callable[[], None],
    ) -> None:
        self.argv = argv
        self._future = future
        self._kill = kill

    def __repr__(self) -> str:
        state = "running" if not self._future.done() else f"exited {self.poll()}"
        return f"<DetachedProcess {self.argv[0]!r} {state}>"

    def poll(self) -> int | None:
        """The command's exit code once it has exited, else ``None`` (never blocks)."""
        if not self._future.done() or self._future.exception() is not None:
            return None
        return self._future.result().returncode

    def done(self) -> bool:
        """Whether the command has exited (or the sandbox ended under it)."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> ExecResult:
        """Wait for the command's exit and return it; ``TimeoutError`` if it runs on past
        ``timeout`` seconds (it keeps running), ``SandboxError`` if the sandbox ended first."""
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self.argv[0]!r} still runs after {timeout:g} s") from None

    async def aresult(self, timeout: float | None = None) -> ExecResult:
        """Async twin of ``result``; cancelling the wait leaves the process running."""
        # A wait that is cancelled or times out cancels the future it awaits: give it a copy.
        copy: concurrent.futures.Future[ExecResult] = concurrent.futures.Future()
        self._future.add_done_callback(lambda done: _copy_outcome(done, copy))
        try:
            return await wait_future(copy, timeout)
        except TimeoutError:
            raise TimeoutError(f"{self.argv[0]!r} still runs after {timeout:g} s") from None

    def kill(self) -> None:
        """Kill the process and everything it started (its whole namespace); idempotent."""
        self._kill()


def finishing(
    process: DetachedProcess, finish: Callable[[ExecResult], ExecResult]
) -> DetachedProcess:
    """``process``, its result passed through ``finish`` once it ends: how the turn adds
    the words the session leaves to it (what stopped the process for memory)."""
    finished: concurrent.futures.Future[ExecResult] = concurrent.futures.Future()
    process._future.add_done_callback(lambda done: _copy_outcome(done, finished, finish))
    return DetachedProcess(process.argv, finished, process._kill)


@attrs.frozen(kw_only=True)
class FsRequest:
    """One generic file primitive in the sandbox's view, as the calls' user.

    ``op`` is ``read`` (``length`` bytes from ``offset``), ``write`` (``data`` at
    ``offset``; ``truncate`` first, ``make_parents`` creates missing folders),
    ``list`` (at most ``limit`` entries), or ``view``: the text of ``view``
    (``lines``, ``find``, ``entries``) over ``arguments``, as the built-in file
    tools show it to a model (its reply has ``text`` and ``is_error``). ``path``
    is a sandbox path, absolute or relative to the workdir (a view takes its
    path from ``arguments``). ``pack`` lists the workspace or reads a batch of
    its files, ``unpack`` restores records into it (a snapshot's, see
    ``sandbox/server/_snapfiles``); each travels as a message of its own.
    ``freeze`` freezes the workspace in place for forks (``sandbox/_frozen``
    sends it and takes the answer's descriptor; see ``sandbox/server/_freeze``).
    """

    op: str = attrs.field(
        validator=attrs.validators.in_(
            ("read", "write", "list", "view", "pack", "unpack", "freeze")
        )
    )
    path: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    timeout: float
    offset: int = attrs.field(default=0, validator=_nonneg)
    length: int = attrs.field(default=0, validator=_nonneg)
    data: bytes = b""
    truncate: bool = False
    make_parents: bool = False
    #: ``list``: the most entries to return (0: the server's own bound).
    limit: int = attrs.field(default=0, validator=_nonneg)
    view: str = ""
    arguments: Mapping[str, object] = attrs.field(factory=dict, converter=dict)
    #: ``pack``, ``unpack`` and ``freeze``: their own fields (``phase``, ``max_files``,
    #: ``index_bytes``, ``upper_bytes``, ``fd``).
    fields: Mapping[str, object] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class FsReply:
    """The answer to an ``FsRequest``: its fields (``size``, ``entries``) and bytes read,
    or ``errno``/``message`` when the sandbox refused (the host raises the matching error)."""

    fields: Mapping[str, object] = attrs.field(factory=dict)
    data: bytes = b""
    errno: str | None = None
    message: str = ""
    #: A snapshot's listing (``pack``, phase ``list``) of a workspace whose overlay the
    #: host laid (Docker as root): the names its upper layer holds, as the host read
    #: them; its reading replaces the server's marks. None: the server marks its files
    #: itself, or no one can.
    upper_names: frozenset[bytes] | None = None
    #: Whether the host read that layer whole (``upper_names`` then holds every name in
    #: it). False with ``upper_names`` set: the host laid the overlay and could not read
    #: its upper layer, so no file may be taken for the lower layer's.
    upper_read: bool = False


class LayerLost(OSError):
    """A freeze's layer the host could not take (or whose answer was malformed): the
    sandbox froze it, and its turn writes on above a layer lost to the host. Here, below
    both the sandbox wing's ``_frozen`` and Docker's host-side freeze, which raise it."""


@attrs.frozen(kw_only=True)
class OutboxFile:
    """A file a call left in ``$VESSEL_OUTBOX``, copied out to the host."""

    name: str
    size: int
    path: Path


@attrs.frozen(kw_only=True)
class MemoryStop:
    """What stopped a call for memory, in bytes: a fact the session reports and
    ``results`` words (for the model, and for the host at the end of an exec's stderr).

    ``by`` is ``watch`` when the memory watch stopped the call (the turn's calls
    held ``held`` bytes, more than ``limit``) and ``kernel`` when the kernel's OOM
    killer stopped ``killed`` of the turn's processes while it ran (the turn's
    group held its whole ``limit``).
    """

    by: Literal["watch", "kernel"]
    limit: int
    held: int = 0
    killed: int = 0


@attrs.frozen(kw_only=True)
class RunOutcome:
    """What a confined call did: its output (bounded), exit status and outbox files.

    ``output`` is what the command printed; what else the model is told of the call
    comes as facts (``memory``, ``skipped``, ``unlisted``), which ``results`` words.
    """

    output: str
    exit_code: int | None
    timed_out: bool = False
    #: Characters of output beyond ``output_chars`` that were counted and dropped.
    dropped_chars: int = 0
    files: tuple[OutboxFile, ...] = ()
    duration: float = 0.0
    #: Backend notes for the host (never shown to the model), such as a fallback taken.
    metadata: Mapping[str, str] = attrs.field(factory=dict)
    #: Whether a bound of the turn stopped the call: its memory (``memory`` says how), its
    #: processes at their limit or the workspace it filled (its own errors say so).
    stopped_by_limit: bool = False
    #: What stopped the call for memory: the memory watch, then the kernel's OOM killer.
    memory: tuple[MemoryStop, ...] = ()
    #: Outbox entries left out, counted by reason: the server's (``server/_outbox.py``:
    #: ``not_plain``, ``not_utf8``, ``too_many``, ``too_big``) or the host's
    #: (``_session.py``: ``turn_files``, ``turn_bytes``, ``not_written``).
    skipped: Mapping[str, int] = attrs.field(factory=dict)
    #: Why the host could not write an outbox file (``not_written``): the OS's words.
    unwritten: str = ""
    #: Why the outbox folder could not be listed (its path and the OS's words), so no
    #: file came back; empty when it was listed.
    unlisted: str = ""


@attrs.frozen(kw_only=True)
class FileOutcome:
    """The text a file tool (read, glob, list) produced in the sandbox's own view."""

    text: str
    is_error: bool = False


class Channel(Protocol):
    """A byte pipe to a running sandbox server, plus the means to tear the sandbox down.

    ``recv`` returns ``b""`` only at end of stream. ``close`` must kill the whole
    sandbox (every process in it) and release what the backend created for the
    turn; it is idempotent and never raises. ``describe_exit`` says, for an
    error message, why the sandbox ended (exit status, the backend's stderr tail).
    """

    def send(self, data: bytes) -> None: ...
    def recv(self, size: int) -> bytes: ...
    def close(self) -> None: ...
    def describe_exit(self) -> str: ...


class SandboxSession(abc.ABC):
    """One turn's running sandbox. Methods may be called from several threads at once."""

    policy: Policy
    backend: str
    #: The host uid of the sandbox's processes as a unix socket's peer sees it (SO_PEERCRED):
    #: the turn's egress proxy admits no other. None where the backend cannot know it (an
    #: engine that maps container uids itself).
    peer_uid: int | None = None

    @abc.abstractmethod
    def run(self, request: RunRequest) -> RunOutcome:
        """Run one confined call and wait for it.

        Must raise ``SandboxError`` if the sandbox died or broke protocol; a
        command that fails, crashes or times out is a normal ``RunOutcome``.
        """

    @abc.abstractmethod
    async def arun(self, request: RunRequest) -> RunOutcome:
        """Async twin of ``run``; same contract."""

    def exec(self, request: ExecRequest) -> ExecResult:
        """Run a host's command, its stdout and stderr apart, and wait for it.

        Same contract as ``run``: ``SandboxError`` if the sandbox died; a command
        that fails, crashes or times out is a normal ``ExecResult``. A session
        that cannot run one raises ``BackendUnavailableError`` saying so.
        """
        raise BackendUnavailableError(f"the {self.backend} backend cannot run exec")

    async def aexec(self, request: ExecRequest) -> ExecResult:
        """Async twin of ``exec``; cancelling it kills the command."""
        return self.exec(request)

    def detach(self, request: DetachRequest) -> DetachedProcess:
        """Start a detached process and return once it runs (see ``DetachedProcess``).

        Raises ``UsageError`` when the turn holds its bound of detached processes,
        ``BackendUnavailableError`` when this session cannot detach one, and
        ``SandboxError`` if the sandbox died.
        """
        raise BackendUnavailableError(f"the {self.backend} backend cannot start detached processes")

    async def adetach(self, request: DetachRequest) -> DetachedProcess:
        """Async twin of ``detach``."""
        return self.detach(request)

    @abc.abstractmethod
    def fs(self, request: FsRequest) -> FsReply:
        """Run one file primitive in the sandbox's view, as the calls' user.

        A refusal (missing file, outside the writable places) is an ``FsReply``
        with ``errno``; a dead sandbox raises ``SandboxError``. A session without
        them raises ``BackendUnavailableError`` (and the turn's sandbox lives on).
        """
        raise BackendUnavailableError(
            f"the {self.backend} backend has no file primitives (they live in the sandbox "
            "server: the docker backend, with an image that has python3, has them)"
        )

    @abc.abstractmethod
    async def afs(self, request: FsRequest) -> FsReply:
        """Async twin of ``fs``; same contract."""
        return self.fs(request)

    @abc.abstractmethod
    def close(self) -> None:
        """End the turn: kill everything in the sandbox and remove its workspace. Never raises."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def unenforced(self) -> Mapping[Promise, str]:
        """Promises this running turn does not keep, each with why (what ``doctor`` reports)."""
        return {}

    def alive(self) -> bool:
        """Whether the sandbox still runs, as far as the session knows (a warm pool asks)."""
        return True

"""What the executor and a turn's session share: requests, outcomes, the session API.

``SandboxSession`` is the API the executor calls for one turn (``run`` and
``file_tool``, each with an async twin). The library implements it once, in
``_session.ServerSession``, over a ``Channel`` a backend opens (see
``_base.Sandbox``); the values here travel between the two.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

import attrs

from ._policy import Policy, Promise

__all__ = [
    "BackendReport",
    "Channel",
    "FileOutcome",
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


@attrs.frozen(kw_only=True)
class OutboxFile:
    """A file a call left in ``$VESSEL_OUTBOX``, copied out to the host."""

    name: str
    size: int
    path: Path


@attrs.frozen(kw_only=True)
class RunOutcome:
    """What a confined call did: its output (bounded), exit status and outbox files."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    #: Characters of output beyond ``output_chars`` that were counted and dropped.
    dropped_chars: int = 0
    files: tuple[OutboxFile, ...] = ()
    duration: float = 0.0
    #: Backend notes for the host (never shown to the model), such as a fallback taken.
    metadata: Mapping[str, str] = attrs.field(factory=dict)


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

    @abc.abstractmethod
    def run(self, request: RunRequest) -> RunOutcome:
        """Run one confined call and wait for it.

        Must raise ``SandboxError`` if the sandbox died or broke protocol; a
        command that fails, crashes or times out is a normal ``RunOutcome``.
        """

    @abc.abstractmethod
    async def arun(self, request: RunRequest) -> RunOutcome:
        """Async twin of ``run``; same contract."""

    @abc.abstractmethod
    def file_tool(
        self, tool: str, arguments: Mapping[str, object], *, timeout: float
    ) -> FileOutcome:
        """Answer ``read``, ``glob`` or ``list`` in the sandbox's view, as its unprivileged user.

        The model's mistakes (missing file, path outside the agent's data) are a
        ``FileOutcome`` with ``is_error``; a dead sandbox raises ``SandboxError``.
        """

    @abc.abstractmethod
    async def afile_tool(
        self, tool: str, arguments: Mapping[str, object], *, timeout: float
    ) -> FileOutcome:
        """Async twin of ``file_tool``; same contract."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the turn: kill everything in the sandbox and remove its workspace. Never raises."""

    def unenforced(self) -> Mapping[Promise, str]:
        """Promises this running turn does not keep, each with why (what ``doctor`` reports)."""
        return {}

    def alive(self) -> bool:
        """Whether the sandbox still runs, as far as the session knows (a warm pool asks)."""
        return True

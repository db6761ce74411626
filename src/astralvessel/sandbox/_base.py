"""The contract between the library and a sandbox backend: a channel to a running server.

Every backend runs the same sandbox server (``astralvessel.sandbox.server``)
inside its sandbox. So a backend says only two things: whether it can run here
(``probe``) and how to start a sandbox for a policy with the server in it,
returning a ``Channel`` to the server's stdin and stdout (``open``). The
library owns everything above the channel: ``Sandbox.start`` boots the server
and wraps it in the one ``ServerSession``, which speaks the protocol, runs
calls and answers the file tools, sync and async. A backend therefore names
no model-facing tool and writes no sync/async twins. See ``docs/backends.md``.

The request and outcome values and the session API live in ``_api``; they are
re-exported here, where backends and the executor have always found them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

import attrs

from ..errors import UsageError
from ._api import (
    BackendReport,
    Channel,
    FileOutcome,
    OutboxFile,
    RunOutcome,
    RunRequest,
    SandboxSession,
)
from ._policy import Policy
from ._session import ServerBuild, ServerSession

__all__ = [
    "BackendReport",
    "Channel",
    "FileOutcome",
    "OutboxFile",
    "RunOutcome",
    "RunRequest",
    "Sandbox",
    "SandboxSession",
    "ServerLink",
    "ServerOptions",
]


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _str_map(value: Mapping[str, str]) -> Mapping[str, str]:
    return dict(value)


def _programs(value: Mapping[str, bytes]) -> Mapping[str, bytes]:
    programs = dict(value)
    if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in programs.items()):
        raise TypeError("helper_seccomp maps helper names to BPF programs (bytes)")
    return programs


def _optional_uid(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"a uid or gid is a non-negative integer or None, not {value!r}")
    return value


@attrs.frozen(kw_only=True)
class ServerOptions:
    """How the library boots the sandbox server on a channel: what the server must do per call.

    ``confine`` asks the server to confine each call (its own PID and mount
    namespaces, rlimits, the call filter) and to refuse, unless the policy
    relaxed it, any promise it cannot keep. ``drop_uid`` and ``drop_gid`` are
    the host user calls become (``None`` where the sandbox already runs as its
    unprivileged user). ``seccomp`` is the call filter as BPF bytes, and
    ``helper_seccomp`` the filter each of the server's helpers stacks over the
    server's own before it reads anything a model sent, by helper name
    (``_seccomp.helper_programs``; a helper not named runs under the server's).
    ``path_map`` maps sandbox paths to where the server sees them (only for a
    server that runs without a mount namespace of its own, as ``unconfined``).
    ``memory_events`` names, in the server's view, files of the turn's memory
    cgroup that count the kernel's OOM kills (``oom_kill`` in v1's
    ``memory.oom_control`` or v2's ``memory.events``), the first that opens
    wins: a call during which the count rises is reported as stopped for memory.
    ``memory_limits`` names, the same way, files that hold the group's limit
    (v1's ``memory.stat``, for its ``hierarchical_memory_limit``, or v2's
    ``memory.max``): such a call's note states the limit the kernel applied.
    ``probe_key`` names everything besides the hello that the server's
    confinement probe depends on (the binary, the interpreter, the image):
    turns with the same key and the same confinement settings reuse the first
    one's probe result instead of probing again (``None``: every turn probes).
    """

    confine: bool
    drop_uid: int | None = attrs.field(default=None, converter=_optional_uid)
    drop_gid: int | None = attrs.field(default=None, converter=_optional_uid)
    seccomp: bytes | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(bytes))
    )
    helper_seccomp: Mapping[str, bytes] = attrs.field(factory=dict, converter=_programs)
    path_map: Mapping[str, str] = attrs.field(factory=dict, converter=_str_map)
    #: Seconds the server may take to say ``ready`` (an engine may be slow to start a container).
    ready_timeout: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    probe_key: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )
    memory_events: tuple[str, ...] = attrs.field(
        default=(),
        converter=_str_tuple,
        validator=attrs.validators.deep_iterable(attrs.validators.instance_of(str)),
    )
    memory_limits: tuple[str, ...] = attrs.field(
        default=(),
        converter=_str_tuple,
        validator=attrs.validators.deep_iterable(attrs.validators.instance_of(str)),
    )
    #: The host uid the sandbox's processes have (``SandboxSession.peer_uid``); None: unknown.
    peer_uid: int | None = attrs.field(default=None, converter=_optional_uid)
    #: The server's modules compiled by the sandbox's Python (``compile_command``), when
    #: it is not the host's: a Docker image's interpreter then loads code, not source.
    build: ServerBuild | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(ServerBuild))
    )


@attrs.frozen(kw_only=True)
class ServerLink:
    """What ``Sandbox.open`` returns: a channel to a just-started server and how to boot it."""

    channel: Channel
    options: ServerOptions = attrs.field(validator=attrs.validators.instance_of(ServerOptions))
    #: Waits for what the sandbox still had in hand when its server connected (a Docker
    #: engine's answer to the start, while the server booted); raises if that failed.
    #: Called once the server is ready, so the two overlap.
    settle: Callable[[], None] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )


class Sandbox(abc.ABC):
    """A sandbox backend. Subclasses set ``name`` and implement ``probe`` and ``open``.

    ``start`` is implemented here, once, over ``open``: hosts and tests call
    it; a backend need not override it.
    """

    #: The backend's name in ``--backend``, discovery and ``doctor``.
    name: ClassVar[str]
    #: Whether automatic selection may pick it (``Unconfined`` never is).
    confined: ClassVar[bool] = True

    @abc.abstractmethod
    def probe(self) -> BackendReport:
        """Say whether this backend can start here and which promises it enforces. Never raises."""

    @abc.abstractmethod
    def open(self, policy: Policy) -> ServerLink:
        """Start a sandbox for ``policy`` with the server in it; return the channel to it.

        The server is started with ``server_command(python)`` (a path inside
        the sandbox) and nothing written to it yet: the library sends its
        payload and ``hello``. Must raise ``BackendUnavailableError`` when the
        backend cannot run here (saying what to install),
        ``PromiseNotEnforcedError`` when it would break a promise that
        ``policy.relaxed`` does not name, and ``SandboxError`` when the
        sandbox fails to start. Whatever it created must be released by the
        channel's ``close``.
        """

    def start(self, policy: Policy) -> SandboxSession:
        """Start one turn's sandbox for ``policy`` and boot the server in it.

        Raises what ``open`` raises; ``SandboxError`` if the server does not
        come up; ``PromiseNotEnforcedError`` if the server cannot confine calls
        as the policy asks.
        """
        if policy.egress_socket is not None and not self.confined:
            raise UsageError(
                f"the {self.name} backend gives calls the host's own network, so a network "
                "allow-list would mean nothing there; use a confined backend"
            )
        link = self.open(policy)
        options = link.options
        session = ServerSession.start(
            link.channel,
            policy,
            backend=self.name,
            confine=options.confine,
            drop_uid=options.drop_uid,
            drop_gid=options.drop_gid,
            seccomp=options.seccomp,
            helper_seccomp=options.helper_seccomp,
            path_map=options.path_map,
            ready_timeout=options.ready_timeout,
            probe_key=options.probe_key,
            build=options.build,
            memory_events=options.memory_events,
            memory_limits=options.memory_limits,
        )
        session.peer_uid = options.peer_uid
        if link.settle is not None:
            try:
                link.settle()
            except BaseException:
                session.close()
                raise
        return session

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

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
import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

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
from ._server_options import ServerOptions
from ._session import ServerSession

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
    #: Whether the backend laid the workspace's overlay on ``policy.workspace_lower`` itself
    #: (Docker as root: the host mounts it). ``None``: the server is asked to, as the
    #: namespace backends' are; ``True``: it is laid; ``False``: it could not be, and the
    #: host copies the files in. Either way the server is not asked.
    lower_laid: bool | None = None
    #: Where the backend laid that overlay: the names its upper layer holds, read by the
    #: host (None from it: unreadable). The session gives them with each listing of the
    #: workspace (``FsReply.upper_names``), as a server that laid it marks them itself.
    upper_names: Callable[[], frozenset[bytes] | None] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )
    #: Raises the turn's memory bound by that many bytes (its memory group's, where it has
    #: one): a workspace frozen in place stays charged to the turn that froze it, and the
    #: turn must not lose that much of its calls' memory to its forks' shared files.
    widen_memory: Callable[[int], None] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )
    #: A frozen layer's descriptor to pass the server in place of
    #: ``policy.workspace_lower_fd`` (an ordinary user's Docker fork: the layer idmapped to
    #: the fork's uid, ``docker._reader``); closed once the server has its hello.
    lower_fd: int | None = None
    #: The layers below ``lower_fd``, top first, passed alike in place of
    #: ``policy.workspace_below_fds`` (a stack's, each idmapped); closed alike.
    below_fds: tuple[int, ...] = ()
    #: The host's end of the socket a fork's frozen layer goes to the server on
    #: (``Policy.adoptable``; ``SandboxSession.adopt``), closed with the session.
    adopt_socket: socket.socket | None = None
    #: Makes a fork's frozen layer the server's own before it goes on ``adopt_socket``
    #: (Docker's: an idmapped clone for the turn's uid, made by its reader); the result is
    #: the caller's to close. None: the layer goes as it is.
    fit_layer: Callable[[int], int] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )
    #: Lays a fork's files (a tree, or a stack of layers, top first) on the warm session's
    #: workspace from the host (root's Docker host, ``docker._adoption.lay_adoption``) and
    #: returns what lists and holds that overlay (``SandboxSession.adopt_laid``). None: the
    #: server lays what it is passed (``adopt``).
    lay_adoption: Callable[..., Any] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )
    #: Reads a frozen layer the host cannot read itself (an ordinary user's Docker host:
    #: the layer's files are the turn's uid's), given the layer's descriptor: a context
    #: of ``listing(outbox, max_files)`` and ``digests(files)`` (``docker._reader``).
    read_layer: Callable[[int], AbstractContextManager[Any]] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )
    #: Makes the merged view of a stack of frozen layers the host cannot read itself
    #: (``layers`` top first, ``userxattr``: the attribute mode their whiteouts are in):
    #: a detached read-only overlay's descriptor, the caller's, read as a layer is
    #: (``read_layer``; ``docker._reader``).
    merge_layers: Callable[[tuple[int, ...], bool], int] | None = attrs.field(
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
        booted = (
            policy
            if link.lower_laid is None
            else attrs.evolve(
                policy,
                workspace_lower=None,
                workspace_lower_fd=None,
                workspace_below_fds=(),
                workspace_layers=(),
            )
        )
        if link.lower_fd is not None:
            booted = attrs.evolve(
                booted, workspace_lower_fd=link.lower_fd, workspace_below_fds=link.below_fds
            )
        try:
            session = ServerSession.start(
                link.channel, booted, backend=self.name, options=link.options
            )
        except BaseException:
            if link.adopt_socket is not None:
                link.adopt_socket.close()
            raise
        finally:
            for fd in (link.lower_fd, *link.below_fds):
                if fd is not None:
                    os.close(fd)
            if link.options.pass_adopt_socket and link.options.adopt_socket is not None:
                os.close(link.options.adopt_socket)  # the server has its own now
        session.fit_layer = link.fit_layer
        session.lay_adoption = link.lay_adoption
        session.upper_names = link.upper_names
        session.widen_memory = link.widen_memory
        session.read_layer = link.read_layer
        session.merge_layers = link.merge_layers
        session.adopt_socket = link.adopt_socket
        if link.lower_laid:
            # Read as the server's own report would be (``Executor._restore``): nothing to copy.
            relaxations = dict(session.ready_info.get("relaxations") or {}, workspace_lower=True)
            session.ready_info = {**session.ready_info, "relaxations": relaxations}
        if link.settle is not None:
            try:
                link.settle()
            except BaseException:
                session.close()
                raise
        return session

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

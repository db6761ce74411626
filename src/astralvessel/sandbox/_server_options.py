"""How the library boots the sandbox server on a channel: one value a backend fills in.

A backend's ``Sandbox.open`` returns it (in a ``ServerLink``); the session takes
it whole (``ServerSession.start``) and turns it, with the policy, into the
server's ``hello`` (``_server_hello``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from ._server_code import ServerBuild

__all__ = ["ServerOptions"]


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
    #: Whether the server makes a fresh turn's workspace tmpfs itself and holds its detached
    #: original, for an ordinary user's freeze (``server/_heldfs``): the namespace backends,
    #: whose launcher's tmpfs is the sandbox's own, and Docker's for an ordinary user over
    #: the direct channel (the original is passed on its socket). Not Docker's as root: the
    #: engine's tmpfs is the host's to freeze, and one of the server's would refuse it.
    hold_workspace: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: Whether ``Policy.workspace_lower_fd`` goes to the server with the hello over the
    #: channel (``SCM_RIGHTS``: Docker's direct channel, ``send_fds``), not by inheritance.
    pass_lower_fd: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: The server's end of the socket a fork's frozen layer may come on later, at this
    #: number in the server (``Policy.adoptable``; ``Hello.adopt_socket``); None: none.
    #: With ``pass_adopt_socket``, the host's own descriptor of that end instead.
    adopt_socket: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(int))
    )
    #: Whether ``adopt_socket`` goes to the server with the hello over the channel
    #: (``SCM_RIGHTS``, after any ``pass_lower_fd`` layer: Docker's direct channel), not
    #: by inheritance; the host closes its copy once the hello is sent (``Sandbox.start``).
    pass_adopt_socket: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool)
    )
    #: The host uid the sandbox's processes have (``SandboxSession.peer_uid``); None: unknown.
    peer_uid: int | None = attrs.field(default=None, converter=_optional_uid)
    #: The server's modules compiled by the sandbox's Python (``compile_command``), when
    #: it is not the host's: a Docker image's interpreter then loads code, not source.
    build: ServerBuild | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(ServerBuild))
    )

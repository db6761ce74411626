"""The turn's sandbox policy: one value that every backend compiles into its own mechanism.

Pure data and pure functions only. A backend reads a ``Policy`` and turns it into
an invocation (argv, environment, seccomp program, container options); nothing
here touches the system.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

import attrs

from .._ground._netallow import HostPattern, parse_allow_list
from .._ground._suggest import unknown_name
from ..errors import UsageError
from ._uids import UidRange
from .server._messages import MAX_LAYERS

__all__ = [
    "AGENT_DIR",
    "EGRESS_DIR",
    "EGRESS_PORT",
    "EVAL_RELAXATIONS",
    "OUTBOX_DIR",
    "ROOT_DIRS",
    "SYSTEM_DIRS",
    "WORKSPACE_DIR",
    "WORKSPACE_LOWER_DIR",
    "Limits",
    "Mount",
    "Policy",
    "Promise",
    "Relaxations",
]

#: Where the agent folder appears inside every sandbox (read-only).
AGENT_DIR = PurePosixPath("/agent")
#: The turn's writable workspace: ``$HOME`` and ``$TMPDIR``.
WORKSPACE_DIR = PurePosixPath("/workspace")
#: ``$VESSEL_OUTBOX``: files a call leaves here come back in ``ToolResult.files``.
OUTBOX_DIR = WORKSPACE_DIR / "outbox"
#: The workspace holds one inode per this many bytes of its disk limit (``nr_inodes``).
BYTES_PER_INODE = 2048
#: ... and never fewer inodes than this, however small the disk limit.
MIN_INODES = 1024
#: Where the host's egress proxy socket appears inside a sandbox whose policy allows a network.
#: Calls cannot use it (the call filter refuses unix sockets); the server's relay does.
EGRESS_DIR = PurePosixPath("/run/egress")
EGRESS_SOCKET_NAME = "proxy.sock"
#: Where a snapshot's tree on the host is bound read-only for the server to lay the
#: workspace's overlay on (``Policy.workspace_lower``); covered once the overlay holds it.
WORKSPACE_LOWER_DIR = PurePosixPath("/.vessel-lower")
#: The loopback port of the server's relay to the egress proxy: what ``HTTP_PROXY`` names.
EGRESS_PORT = 3128
#: System directories, bound read-only: the host's (bubblewrap, nsjail) or the image's (Docker).
SYSTEM_DIRS: tuple[PurePosixPath, ...] = tuple(
    PurePosixPath(p)
    for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
)
#: Root directories beside the system dirs that a writable root adds (empty, unless the image
#: has them), each writable for the turn.
ROOT_DIRS: tuple[PurePosixPath, ...] = tuple(
    PurePosixPath(p)
    # /run: where adduser, useradd and other root tools take their locks.
    for p in ("/opt", "/var", "/srv", "/home", "/mnt", "/root", "/run", "/tmp")  # noqa: S108 - a sandbox path
)
#: The sandbox's ``$PATH`` and ``$LANG``; the other three variables point into the workspace.
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
SANDBOX_LANG = "C.UTF-8"


class Promise(enum.Enum):
    """A confinement promise every backend keeps for every confined call (see the threat model)."""

    NO_NETWORK = "no-network"
    PROCESS_ISOLATION = "process-isolation"
    NO_UNIX_SOCKETS = "no-unix-sockets"
    NO_IPC = "no-ipc"
    CLEAN_ENVIRONMENT = "clean-environment"
    NO_NEW_SESSIONS = "no-new-sessions"
    OPEN_FILES_LIMIT = "open-files-limit"
    DISK_LIMIT = "disk-limit"
    MEMORY_LIMIT = "memory-limit"
    PROCESS_LIMIT = "process-limit"
    UNPRIVILEGED = "unprivileged"
    SECCOMP = "seccomp"
    FILESYSTEM_VIEW = "filesystem-view"

    @property
    def summary(self) -> str:
        """One line saying what the promise guarantees."""
        return _PROMISE_SUMMARIES[self]


_PROMISE_SUMMARIES = {
    Promise.NO_NETWORK: "no network: only the sandbox's own loopback, with no routes out",
    Promise.PROCESS_ISOLATION: "cannot see or signal any process but its own",
    Promise.NO_UNIX_SOCKETS: "only IP and netlink-route sockets: no unix sockets, no vsock",
    Promise.NO_IPC: "no SysV or POSIX shared memory, message queues or semaphores",
    Promise.CLEAN_ENVIRONMENT: (
        "environment is exactly PATH, LANG, HOME, TMPDIR, VESSEL_OUTBOX, and the proxy "
        "variables only when the turn allows a network"
    ),
    Promise.NO_NEW_SESSIONS: (
        "setsid/setpgid refused; every process a call started is gone when it returns"
    ),
    Promise.OPEN_FILES_LIMIT: "at most `open_files` open files",
    Promise.DISK_LIMIT: "no file above the disk limit, and the workspace never above it",
    Promise.MEMORY_LIMIT: "memory limited to `memory_mb`",
    Promise.PROCESS_LIMIT: "process count limited to `processes`",
    Promise.UNPRIVILEGED: (
        "no privilege on the host and nothing beyond what the turn was given: "
        "no capability in any namespace, securebits locked, no_new_privs"
    ),
    Promise.SECCOMP: "seccomp filter: architecture checked, dangerous system calls refused",
    Promise.FILESYSTEM_VIEW: (
        "only system dirs, /agent, workdir, mounts and the workspace; read-only but the workspace"
    ),
}


def _relaxation(gives_up: str) -> bool:
    """An opt-in eval relaxation, off unless chosen; ``gives_up`` is what ``doctor`` prints."""
    return attrs.field(
        default=False,
        validator=attrs.validators.instance_of(bool),
        metadata={"gives_up": gives_up},
    )


@attrs.frozen(kw_only=True)
class Relaxations:
    """The opt-in eval relaxations: ``vessel.toml``'s ``[sandbox]`` table is structured straight
    into this value, and ``Policy`` holds them as its own fields (a ``Policy`` is one), so
    ``Policy(writable_root=True)``, ``attrs.evolve`` and ``[sandbox]`` all pass the same checks.
    See docs/eval-relaxations.md.
    """

    #: Opt-in for eval harnesses (package installs, tools that write system paths): the root's
    #: directories (/usr, /etc, /opt, /var, ...) are writable per-turn layers on the
    #: workspace's disk, counted against ``limits.disk_mb``; the host's files never change.
    writable_root: bool = _relaxation(
        "the read-only system dirs: /usr, /etc, /opt, /var, ... become per-turn layers that "
        "calls of the turn may change; the host's files never change, and every byte counts "
        "against the disk limit"
    )
    #: Opt-in for tools that insist on root: calls are uid 0 and gid 0 of their own user
    #: namespace, still with every capability set empty; on the host they stay the sandbox's
    #: unprivileged identity.
    root_identity: bool = _relaxation(
        "the uid number only: calls are uid 0 of their own user namespace, every capability "
        "set still empty; their files land as the unprivileged user"
    )
    #: Opt-in for long-lived tool servers (inspect's sandbox tools, language servers): calls
    #: may create unix sockets and new sessions, and each call has pseudo-terminals from a
    #: devpts instance of its own. The turn's filesystem and network namespace are its own,
    #: so a socket reaches only what the turn's processes listen on.
    tool_servers: bool = _relaxation(
        "no-unix-sockets and no-new-sessions, within the turn: calls may open unix sockets "
        "(reaching only what the turn's own processes listen on), start sessions, and open "
        "pseudo-terminals of a devpts instance private to each call"
    )

    @property
    def relaxations(self) -> Relaxations:
        """The relaxations alone, as a plain value (of a ``Policy``, or of ``[sandbox]``)."""
        return Relaxations(**{name: getattr(self, name) for name in EVAL_RELAXATIONS})


#: The opt-in eval relaxations (``Relaxations``' fields, and ``Policy``'s) and what each
#: gives up; ``doctor`` prints them. See docs/eval-relaxations.md.
EVAL_RELAXATIONS: Mapping[str, str] = {
    field.name: field.metadata["gives_up"] for field in attrs.fields(Relaxations)
}


def _host_path(value: str | Path) -> Path:
    return Path(value).expanduser().resolve()


def _existing(instance: Mount, attribute: object, source: Path) -> None:
    if not source.exists():
        raise UsageError(f"host path {str(source)!r} for {str(instance.target)!r} does not exist")


def _mountable(instance: Mount, attribute: object, target: PurePosixPath) -> None:
    check_mount_target(target)


def check_mount_target(target: PurePosixPath) -> None:
    """``UsageError`` unless ``target`` is a sandbox path a mount may take (pure: no disk)."""
    if not target.is_absolute() or ".." in target.parts:
        raise UsageError(f"sandbox path {str(target)!r} must be absolute and free of '..'")
    if target == PurePosixPath("/") or any(target == d or d in target.parents for d in _RESERVED):
        raise UsageError(
            f"sandbox path {str(target)!r} is reserved; mount data elsewhere, such as /data"
        )


@attrs.frozen(kw_only=True)
class Mount:
    """A host folder shown inside the sandbox at ``target``, read-only unless ``writable``.

    Every way of building one (``Mount(...)``, ``attrs.evolve``, the named
    constructors) resolves ``source`` and checks that it exists, and that
    ``target`` is absolute, free of ``..`` and not a reserved sandbox path;
    a mount that fails raises ``UsageError``.
    """

    source: Path = attrs.field(converter=_host_path, validator=_existing)
    target: PurePosixPath = attrs.field(converter=PurePosixPath, validator=_mountable)
    writable: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    @classmethod
    def parse(cls, text: str) -> Mount:
        """Parse the CLI's ``SANDBOX_PATH=HOST_PATH[:rw|:ro]`` form."""
        target, sep, rest = text.partition("=")
        if not sep or not target or not rest:
            raise UsageError(f"mount {text!r} is not of the form SANDBOX_PATH=HOST_PATH[:rw]")
        return cls.from_text(target, rest)

    @classmethod
    def from_text(cls, target: str | PurePosixPath, source: str) -> Mount:
        """A sandbox path and ``HOST_PATH[:rw|:ro]``: the dict form of ``Executor(mounts=)``."""
        writable = source.endswith(":rw")
        path = source[: -len(":rw")] if writable else source.removesuffix(":ro")
        return cls.from_pair(target, path, writable=writable)

    @classmethod
    def from_pair(
        cls, target: str | PurePosixPath, source: str | Path, *, writable: bool = False
    ) -> Mount:
        """Build a mount from a sandbox path and a host path (checked like every Mount)."""
        return cls(source=Path(source), target=PurePosixPath(target), writable=writable)


_RESERVED = (
    *SYSTEM_DIRS,
    AGENT_DIR,
    WORKSPACE_DIR,
    EGRESS_DIR,
    PurePosixPath("/proc"),
    PurePosixPath("/dev"),
)


#: The most open files a turn's processes may each hold (``Limits.open_files``).
MAX_OPEN_FILES = 4096


def _whole_above_zero(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    # A validator of its field alone (``instance`` unused): the TOML converter runs it on the
    # file's value before the class is built, so each wrong limit is named by its path.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"limit {attribute.name} must be a positive integer, not {value!r}")


def _open_files_bound(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value > MAX_OPEN_FILES:
        raise UsageError(f"limit {attribute.name} may not exceed {MAX_OPEN_FILES}")


@attrs.frozen(kw_only=True)
class Limits:
    """Resource limits of one turn; every number is enforced on every backend.

    Each is a whole number above 0 (``open_files`` at most 4096), checked on every
    way of building one (``Limits(...)``, ``attrs.evolve``, vessel.toml's ``[limits]``);
    a wrong one raises ``UsageError`` (a ``ValueError``) naming it.
    """

    disk_mb: int = attrs.field(default=512, validator=_whole_above_zero)
    memory_mb: int = attrs.field(default=1024, validator=_whole_above_zero)
    processes: int = attrs.field(default=256, validator=_whole_above_zero)
    open_files: int = attrs.field(
        default=MAX_OPEN_FILES, validator=[_whole_above_zero, _open_files_bound]
    )

    @property
    def workspace_inodes(self) -> int:
        """How many files, folders and links the workspace may hold (its tmpfs ``nr_inodes``).

        An empty file costs no disk but about 1.4 KiB of kernel memory (inode and
        dentry) that the tmpfs ``size`` does not count; one inode per
        ``BYTES_PER_INODE`` of disk keeps what files can pin below the disk limit.
        """
        return max(MIN_INODES, self.disk_mb * 1024 * 1024 // BYTES_PER_INODE)


def _mount_tuple(mounts: Iterable[Mount]) -> tuple[Mount, ...]:
    return tuple(mounts)


def _patterns(value: Iterable[HostPattern | str]) -> tuple[HostPattern, ...]:
    return parse_allow_list(value)


def promise_set(promises: Iterable[Promise | str]) -> frozenset[Promise]:
    """The promises named; ``UsageError`` listing the known ones for a name that is not."""
    return frozenset(_promise(p) for p in promises)


def _promise(named: Promise | str) -> Promise:
    """The promise ``named``, or ``UsageError`` listing the known ones."""
    try:
        return Promise(named)
    except ValueError:
        raise UsageError(unknown_name("promise", str(named), [p.value for p in Promise])) from None


def _lower_fd(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"workspace_lower_fd must be a descriptor's number, not {value!r}")
    if getattr(instance, "workspace_lower", None) is not None:
        raise UsageError("a policy takes workspace_lower or workspace_lower_fd, not both")


def _path_tuple(paths: Iterable[str | Path]) -> tuple[Path, ...]:
    return tuple(Path(path) for path in paths)


def _layers(instance: object, attribute: attrs.Attribute[tuple[Path, ...]], value: object) -> None:
    if not isinstance(value, tuple) or not value:
        return
    if len(value) > MAX_LAYERS:
        raise UsageError(f"workspace_layers holds at most {MAX_LAYERS} layers, not {len(value)}")
    if getattr(instance, "workspace_lower", None) is not None or (
        getattr(instance, "workspace_lower_fd", None) is not None
    ):
        raise UsageError("a policy takes workspace_layers, workspace_lower or its fd, not two")


def _fd_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _below_fds(
    instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: object
) -> None:
    if not isinstance(value, tuple) or not value:
        return
    if len(value) >= MAX_LAYERS:
        raise UsageError(
            f"workspace_below_fds holds fewer than {MAX_LAYERS} layers, not {len(value)}"
        )
    top = getattr(instance, "workspace_lower_fd", None)
    if top is None:
        raise UsageError("workspace_below_fds lie below workspace_lower_fd, which is missing")
    for fd in value:
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise UsageError(f"workspace_below_fds must be descriptors' numbers, not {fd!r}")
    if len({top, *value}) != len(value) + 1:
        raise UsageError("workspace_below_fds and workspace_lower_fd name a descriptor twice")


def _uid_range(value: UidRange | str | None) -> UidRange | None:
    return None if value is None else UidRange.coerce(value)


@attrs.frozen(kw_only=True)
class Policy(Relaxations):
    """Everything a backend needs to build one turn's sandbox.

    ``relaxed`` names promises the host has explicitly given up; a backend that
    cannot keep a promise not in ``relaxed`` refuses to start. The eval relaxations
    (``writable_root``, ``root_identity``, ``tool_servers``) are ``Relaxations``' fields.
    """

    agent_dir: Path | None = None
    workdir: PurePosixPath = attrs.field(default=WORKSPACE_DIR, converter=PurePosixPath)
    mounts: tuple[Mount, ...] = attrs.field(default=(), converter=_mount_tuple)
    limits: Limits = attrs.field(factory=Limits)
    relaxed: frozenset[Promise] = attrs.field(default=frozenset(), converter=promise_set)
    #: The host folder where calls' outbox files are written and kept after the turn
    #: (``None``: a temporary folder of the turn, removed when it ends and no ``OutboxFile``
    #: naming its files is left). Not part of the confinement, so not part of ``identity``.
    outbox_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    #: The agent's Dockerfile (``[sandbox] dockerfile``, validated by ``Agent.load``): backends
    #: that build an image (Docker) build it; the others ignore it.
    dockerfile: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    #: The hosts calls may reach through the host's egress proxy (``_netallow`` syntax);
    #: empty means no network at all. Part of ``identity``.
    network_allow: tuple[HostPattern, ...] = attrs.field(default=(), converter=_patterns)
    #: The host path of this turn's egress proxy socket, shown at ``EGRESS_DIR`` (set per
    #: turn by the executor; a runtime detail, so not part of ``identity``).
    egress_socket: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path)
    )
    #: A snapshot's tree in the host's store that the workspace starts as, copy-on-write:
    #: the read-only lower layer of an overlay whose upper layer is the workspace's tmpfs
    #: (set per turn by the executor where the backend can; a runtime detail, so not part
    #: of ``identity``).
    workspace_lower: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path)
    )
    #: Or a frozen layer the host holds as this descriptor (an ordinary user's, who cannot
    #: stage it at a path: ``Tree.held_layer``): the launcher passes it to the server at
    #: the same number, and the server lays the overlay on its own clone of it (bubblewrap
    #: and nsjail). A runtime detail, so not part of ``identity``.
    workspace_lower_fd: int | None = attrs.field(default=None, validator=_lower_fd)
    #: And the held frozen layers below it, top first (an ordinary user's stack: a fork
    #: of a fork frozen in place, ``Tree.held_stacked``): passed alike, each cloned and
    #: laid under the overlay with it (bubblewrap and nsjail). A runtime detail.
    workspace_below_fds: tuple[int, ...] = attrs.field(
        default=(), converter=_fd_tuple, validator=_below_fds
    )
    #: Or a stack of frozen layers staged in the host's store, top first (a fork of a
    #: fork frozen in place, root's: ``Tree.stacked``): each is bound read-only and the
    #: server lays the overlay on them all, each idmapped as one tree would be (bubblewrap
    #: and nsjail). A runtime detail, so not part of ``identity``.
    workspace_layers: tuple[Path, ...] = attrs.field(
        default=(), converter=_path_tuple, validator=_layers
    )
    #: Whether the sandbox starts able to be adopted by a fork later: started ahead with
    #: an empty workspace (``Executor(warm=N)``), it gets a socket a fork's frozen layer
    #: can come on, until its first request (``SandboxSession.adopt``; bubblewrap and
    #: nsjail). A runtime detail, so not part of ``identity``.
    adoptable: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: The host uids a root host's turns lease from, one per turn (``None``: the
    #: ``ASTRALVESSEL_UID_RANGE`` variable's, else ``DEFAULT_UID_RANGE``). Who the calls
    #: are on the host, not what confines them, so not part of ``identity``.
    uid_range: UidRange | None = attrs.field(default=None, converter=_uid_range)

    def relax(self, *promises: Promise | str) -> Policy:
        """A copy that no longer requires ``promises``: the host's explicit, audited choice."""
        return attrs.evolve(self, relaxed=self.relaxed | promise_set(promises))

    @property
    def environment(self) -> Mapping[str, str]:
        """The exact environment of every confined call.

        With a network allow-list, the usual proxy variables point at the
        server's loopback relay to the host's egress proxy; without one there
        are none, and nothing to reach.
        """
        env = {
            "PATH": SANDBOX_PATH,
            "LANG": SANDBOX_LANG,
            "HOME": str(WORKSPACE_DIR),
            "TMPDIR": str(WORKSPACE_DIR),
            "VESSEL_OUTBOX": str(OUTBOX_DIR),
        }
        if self.network_allow:
            proxy = f"http://127.0.0.1:{EGRESS_PORT}"
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[name] = proxy
            env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
        return env

    @property
    def visible_roots(self) -> tuple[PurePosixPath, ...]:
        """Sandbox paths a file tool may show: system dirs, /agent, workdir, mounts, workspace."""
        roots = [*SYSTEM_DIRS, WORKSPACE_DIR, self.workdir, *(m.target for m in self.mounts)]
        if self.writable_root:
            roots += ROOT_DIRS
        if self.agent_dir is not None:
            roots.append(AGENT_DIR)
        return tuple(dict.fromkeys(roots))

    @property
    def writable_roots(self) -> tuple[PurePosixPath, ...]:
        """Where the host's ``write_file`` may write: the workspace and writable mounts, and
        with ``writable_root`` the root filesystem's folders its overlay makes writable."""
        roots = [WORKSPACE_DIR, *(m.target for m in self.mounts if m.writable)]
        if self.writable_root:
            roots += [*SYSTEM_DIRS, *ROOT_DIRS]
        return tuple(dict.fromkeys(roots))

    def to_json(self) -> dict[str, object]:
        """A canonical, JSON-ready description of the policy (what ``identity`` hashes)."""
        described: dict[str, object] = {
            "agent_dir": None if self.agent_dir is None else str(self.agent_dir),
            "workdir": str(self.workdir),
            "mounts": [
                {"source": str(m.source), "target": str(m.target), "writable": m.writable}
                for m in sorted(self.mounts, key=lambda m: str(m.target))
            ],
            "limits": attrs.asdict(self.limits),
            "relaxed": sorted(p.value for p in self.relaxed),
            "dockerfile": None if self.dockerfile is None else str(self.dockerfile),
            "environment": dict(self.environment),
        }
        # Each eval relaxation only when chosen, so every other policy's identity is unchanged.
        if self.writable_root:
            described["writable_root"] = True
        if self.root_identity:
            described["root_identity"] = True
        if self.tool_servers:
            described["tool_servers"] = True
        if self.network_allow:
            # Only when set, so the identity of every policy without a network is unchanged.
            described["network_allow"] = [str(p) for p in self.network_allow]
        return described

    @property
    def identity(self) -> str:
        """A short hash naming this exact policy, recorded on every result for audit."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

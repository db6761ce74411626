"""The messages between the host and the sandbox server, one class each (stdlib only, Python 3.8+).

Each request the host sends and the server's ``ready`` is a small frozen class
whose annotations are its fields: the one definition both sides build and read
(h11's ``_events`` is the model). ``from_json`` takes a frame header, checks every
field against its annotation and refuses a missing or unknown one with the
field's name; ``to_json`` gives the header back, every field in declared order,
a field left at its default omitted. ``READERS`` picks the class by the frame's
``type``. The envelope, ``type`` and a request's ``id``, is not a field.

Not ``dataclasses`` nor ``typing``: the server must not import ``re``,
``functools`` or ``enum`` (``_lean``), which they bring; a field's annotation is
read as text, and only the few forms used here are understood.
"""

from __future__ import annotations

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import dataclass_transform

    _M = TypeVar("_M", bound="Message")
else:

    def dataclass_transform(**_options: object) -> object:
        return lambda cls: cls


__all__ = [
    "READERS",
    "Adopt",
    "Cancel",
    "FileOp",
    "Freeze",
    "Hello",
    "Message",
    "Ready",
    "Restore",
    "Run",
    "Shutdown",
    "Snapshot",
]

#: The limits every hello carries, each an integer (``_launch`` applies them).
LIMITS = ("disk_mb", "memory_mb", "processes", "open_files", "workspace_inodes")
_REQUIRED = object()
#: Header keys that are the frame's envelope, not a message's fields.
_ENVELOPE = ("type", "id")
#: The most layers a hello's stacked lower may have (``Hello.workspace_layers``): a fork
#: of a fork of ... frozen in place, each fork's own upper layer over its parent's stack.
MAX_LAYERS = 8


def _one_kind(kind: str) -> Callable[[object], bool]:
    """The check for one alternative of an annotation: a name or ``list[X]``/``dict[str, X]``."""
    if kind.startswith("list[") and kind.endswith("]"):
        item = _kind_check(kind[5:-1])
        return lambda v: isinstance(v, list) and all(item(x) for x in v)
    if kind.startswith("dict[str, ") and kind.endswith("]"):
        value = _kind_check(kind[10:-1])
        return lambda v: (
            isinstance(v, dict) and all(isinstance(k, str) and value(x) for k, x in v.items())
        )
    simple: dict[str, Callable[[object], bool]] = {
        "Any": lambda v: True,
        "None": lambda v: v is None,
        "bool": lambda v: v is True or v is False,
        "int": lambda v: type(v) is int,
        "float": lambda v: type(v) is float or type(v) is int,
        "str": lambda v: type(v) is str,
    }
    if kind not in simple:
        raise TypeError(f"message fields cannot be of type {kind!r}")
    return simple[kind]


def _kind_check(annotation: str) -> Callable[[object], bool]:
    """The check a field's annotation stands for (``int | None``, ``dict[str, str]``...)."""
    checks = [_one_kind(part.strip()) for part in annotation.split(" | ")]
    return lambda v: any(check(v) for check in checks)


@dataclass_transform(kw_only_default=True, frozen_default=True)
class Message:
    """A frame header as a value: its fields are the class's annotations (see the module)."""

    #: The frame's ``type``.
    TYPE: ClassVar[str] = ""
    #: Each field: name, annotation, its check, and its default (``_REQUIRED``: none).
    _FIELDS: ClassVar[tuple[tuple[str, str, Callable[[object], bool], object], ...]] = ()

    def __init_subclass__(cls) -> None:
        annotations: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            # Not inspect.get_annotations: the server must not import inspect (nor re).
            own = klass.__dict__.get("__annotations__", {})  # noqa: RUF063
            for name, kind in own.items():
                if not name.isupper() and not name.startswith("_"):
                    annotations[name] = kind
        cls._FIELDS = tuple(
            (name, kind, _kind_check(kind), getattr(cls, name, _REQUIRED))
            for name, kind in annotations.items()
        )

    def __init__(self, **values: Any) -> None:
        for name, kind, check, default in self._FIELDS:
            value = values.pop(name, default)
            if value is _REQUIRED:
                raise ValueError(f"{self.TYPE!r} message: {name!r} is missing")
            if not check(value):
                raise TypeError(f"{self.TYPE!r} message: {name!r} must be {kind}, not {value!r}")
            object.__setattr__(self, name, value)
        if values:
            raise ValueError(f"{self.TYPE!r} message: unknown field {sorted(values)[0]!r}")
        self._check()

    def _check(self) -> None:
        """What the annotations cannot say; raise ``ValueError``."""

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a {type(self).__name__} message is frozen")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Message)
            and type(other) is type(self)
            and (self.fields() == other.fields())
        )

    __hash__ = None  # type: ignore[assignment] # its fields hold lists and dicts

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.fields().items())
        return f"{type(self).__name__}({shown})"

    @classmethod
    def from_json(cls, header: dict[str, Any]) -> Any:
        """The message in a frame header (of this ``type``); raise ``TypeError`` or
        ``ValueError`` naming the field that is missing, unknown or of the wrong type."""
        if header.get("type") != cls.TYPE:
            raise ValueError(f"expected a {cls.TYPE!r} message, got {header.get('type')!r}")
        return cls(**{k: v for k, v in header.items() if k not in _ENVELOPE})

    def replace(self: _M, **changes: Any) -> _M:
        """A copy with ``changes`` (checked as any message is)."""
        return type(self)(**dict(self.fields(), **changes))

    def fields(self) -> dict[str, Any]:
        """Every field by name, defaults included."""
        return {name: getattr(self, name) for name, _, _, _ in self._FIELDS}

    def to_json(self, id: int | None = None) -> dict[str, Any]:
        """The frame header: ``type``, each field not at its default, and ``id`` if given."""
        header: dict[str, Any] = {"type": self.TYPE}
        for name, _, _, default in self._FIELDS:
            value = getattr(self, name)
            if default is _REQUIRED or value != default:
                header[name] = value
        if id is not None:
            header["id"] = id
        return header


class Hello(Message):
    """How every call of the turn runs (the host's first frame): confined or not, as
    which ids, under which limits, filters and relaxations, and the turn's places.

    ``seccomp`` and ``helper_seccomp`` are BPF programs in base64; ``probed`` is
    what a turn started the same way found (None: probe).
    """

    TYPE = "hello"
    confine: bool
    drop_uid: int | None
    drop_gid: int | None
    seccomp: str | None
    helper_seccomp: dict[str, str]
    env: dict[str, str]
    workdir: str
    workspace: str
    outbox: str
    limits: dict[str, int]
    visible_roots: list[str]
    writable_roots: list[str]
    path_map: dict[str, str]
    #: The egress proxy's ``socket`` and ``port`` (None: no network).
    egress: dict[str, Any] | None
    #: The root directories to make writable (none: a read-only root).
    writable_root: list[str]
    root_identity: bool
    tool_servers: bool
    #: Seconds the file worker may sit idle before the server retires it.
    file_worker_idle: float
    memory_events: list[str]
    memory_limits: list[str]
    probed: dict[str, str] | None
    #: The snapshot's tree to lay the workspace's overlay on (None: an empty workspace).
    workspace_lower: str | None
    #: ``workspace_lower`` holds this many layers, folders ``0``, ``1``... top first (0:
    #: it is one tree); at most ``MAX_LAYERS``.
    workspace_layers: int
    #: A frozen layer to lay it on instead, passed as this descriptor (an ordinary user's
    #: host holds it, unstaged); the server closes it before any call. Over a socket
    #: (Docker's direct channel) it is the descriptor passed with the hello (``SCM_RIGHTS``),
    #: whatever the number.
    workspace_lower_fd: int | None
    #: The held frozen layers below ``workspace_lower_fd``, top first, as descriptors
    #: passed alike (an ordinary user's stack: a fork of a fork frozen in place); at most
    #: ``MAX_LAYERS`` with it. Empty: ``workspace_lower_fd`` is one layer.
    workspace_below_fds: list[int]
    #: Whether to make a fresh workspace's tmpfs again and hold its original (``_heldfs``).
    hold_workspace: bool
    #: A unix socket the host passes a fork's frozen layer on, should it adopt this
    #: sandbox while nothing has touched it (``Adopt``); None: never adopted.
    adopt_socket: int | None

    def _check(self) -> None:
        lower_fd = self.workspace_lower_fd
        if lower_fd is not None and (lower_fd < 0 or self.workspace_lower is not None):
            raise ValueError(
                "'hello' message: 'workspace_lower_fd' must be a descriptor's number, "
                "and only without 'workspace_lower'"
            )
        below = self.workspace_below_fds
        if below and (
            lower_fd is None
            or len(below) >= MAX_LAYERS
            or any(fd < 0 or fd == lower_fd for fd in below)
            or len(set(below)) != len(below)
        ):
            raise ValueError(
                "'hello' message: 'workspace_below_fds' must be distinct descriptors' "
                f"numbers, fewer than {MAX_LAYERS}, and only with 'workspace_lower_fd'"
            )
        if self.workspace_layers and (
            not 0 < self.workspace_layers <= MAX_LAYERS or self.workspace_lower is None
        ):
            raise ValueError(
                f"'hello' message: 'workspace_layers' must be 1 to {MAX_LAYERS}, "
                "and only with 'workspace_lower'"
            )
        egress = self.egress
        if egress is not None and not (
            type(egress.get("socket")) is str and type(egress.get("port")) is int
        ):
            raise ValueError("'hello' message: 'egress' must be null or name a socket and a port")
        if sorted(self.limits) != sorted(LIMITS):
            raise ValueError(f"'hello' message: 'limits' must hold exactly {', '.join(LIMITS)}")
        if not self.file_worker_idle > 0:
            raise ValueError("'hello' message: 'file_worker_idle' must be positive")

    def call_filter(self) -> bytes | None:
        """The calls' seccomp program, or None."""
        import binascii  # not base64, which imports re (and enum)

        return None if self.seccomp is None else binascii.a2b_base64(self.seccomp)

    def helper_filter(self, name: str) -> bytes | None:
        """The program helper ``name`` stacks over the server's, or None."""
        import binascii

        program = self.helper_seccomp.get(name)
        return None if program is None else binascii.a2b_base64(program)


class Ready(Message):
    """The server's answer to the hello: what it is and what came of each request."""

    TYPE = "ready"
    #: True: calls reach the egress proxy; None: no network asked; else why not.
    egress: bool | str | None
    version: int
    python: str
    pid: int
    uid: int
    euid: int
    gid: int
    confine: bool
    pid_namespace: bool
    seccomp: bool
    #: Whether the file primitives (``fs`` requests) are served; informative only.
    fs: bool
    #: The confinement steps that cannot work here, each with why.
    problems: dict[str, str]
    #: What each relaxation asked for became, or a text saying why not.
    relaxations: dict[str, Any]
    #: What the probe alone found, for the host to hand later turns.
    probed: dict[str, str]


class Run(Message):
    """Run one command: a tool call, an exec (``split`` streams) or a detached process.

    ``argv`` travels in the body (``argv_bytes`` of NUL-separated UTF-8, then
    stdin), so a command line as long as the kernel takes never meets the
    header's bound; an ``argv`` list in the header is read as well.
    """

    TYPE = "run"
    split: bool = False
    detach: bool = False
    argv_bytes: int | None = None
    argv: list[str] | None = None
    cwd: str | None = None
    #: Seconds (0: a detached process has no deadline).
    timeout: float = 30.0
    output_chars: int = 30000
    output_bytes: int = 0
    env: dict[str, str] | None = None
    #: An exec's ``[uid, gid]``, as the host resolved them.
    user: list[int] | None = None


class FileOp(Message):
    """A file primitive (``read``, ``write``, ``list``, ``view``), as the calls' user."""

    TYPE = "fs"
    #: The op the worker runs for this message (None: its ``op`` field).
    WORKER_OP: ClassVar[str | None] = None
    op: str
    path: str = ""
    timeout: float = 30.0
    offset: int = 0
    length: int = 0
    limit: int = 0
    truncate: bool = False
    make_parents: bool = False
    view: str = ""
    arguments: dict[str, Any] | None = None


class Snapshot(FileOp):
    """A snapshot's ``pack``: list the workspace, or read a batch of its files."""

    TYPE = "snapshot"
    WORKER_OP = "pack"
    #: ``list`` or ``read``.
    phase: str
    max_files: int = 0


class Restore(FileOp):
    """A snapshot's ``unpack``: its records into the workspace (an index, then data)."""

    TYPE = "restore"
    WORKER_OP = "unpack"
    index_bytes: int = 0


#: What a ``freeze`` message asks (``Freeze.phase``).
FREEZE_PHASES = ("freeze", "release", "prepare", "frozen")


class Freeze(FileOp):
    """Freeze the workspace in place for the host to fork from (``_freeze``), or, phase
    ``release``, close the server's copy of a frozen clone's descriptor ``fd``.

    Where the host mounts for the server (Docker's, which has no ``CAP_SYS_ADMIN`` over
    the workspace's tmpfs), phase ``prepare`` asks only for the server's refusals
    (``EBUSY`` while a call runs) and the workspace's path and inode bound, and phase
    ``frozen``, sent once the host's step ran (laid or not), has the server make again
    what copied the old view.

    The server answers it itself, in order with the file requests, not the worker.
    """

    TYPE = "freeze"
    WORKER_OP = "freeze"
    #: ``freeze``, ``release``, ``prepare`` or ``frozen``.
    phase: str = "freeze"
    #: ``freeze``: the most bytes the workspace's new upper layer holds (the turn's disk limit).
    upper_bytes: int = 0
    #: ``release``: the descriptor number the freeze's answer gave.
    fd: int = -1
    #: ``freeze``: the host takes only the workspace's held original (``_heldfs``; an
    #: ordinary user's host, which passes it to forks by descriptor): refused before
    #: anything changes where the server holds none.
    held: bool = False
    #: ``freeze``: the descriptor goes with the answer over the host's socket
    #: (``SCM_RIGHTS``: Docker's direct channel, whose host may not ``pidfd_getfd`` the
    #: server); the host still releases it. Refused (``EOPNOTSUPP``) over pipes.
    passed: bool = False
    #: ``freeze``: a fork's own upper layer alone is frozen (``_freeze.freeze_fork``), for
    #: the host to stack over the layers the fork lies on; refused (``EOPNOTSUPP``) unless
    #: the overlay laid at hello on a bound lower is the workspace still.
    stack: bool = False

    def _check(self) -> None:
        if self.phase not in FREEZE_PHASES:
            raise ValueError(f"'freeze' message: 'phase' must be one of {FREEZE_PHASES}")
        if self.phase == "freeze" and self.upper_bytes <= 0:
            raise ValueError("'freeze' message: 'upper_bytes' must be positive")


class Adopt(Message):
    """Lay the workspace's overlay on the frozen layer the host passed just before, over
    ``Hello.adopt_socket``: a warm sandbox taken by a fork (``_adopt``). Answered as a
    file request (``fs_result``), refused on a sandbox any request has touched."""

    TYPE = "adopt"
    #: The host (root, Docker's) has laid the overlay on ``/workspace`` itself and passed
    #: no layer: the server checks its workspace is now an overlay, not its own tmpfs, and
    #: makes its outbox and views again there (``_adopt.check_laid``).
    laid: bool = False


class Cancel(Message):
    """Kill the call ``id`` (a detached process, a call the host stopped waiting for)."""

    TYPE = "cancel"


class Shutdown(Message):
    """End the turn: the server kills its calls and exits."""

    TYPE = "shutdown"


#: The class of each message, by its frame ``type``.
READERS: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (Hello, Ready, Run, FileOp, Snapshot, Restore, Freeze, Adopt, Cancel, Shutdown)
}

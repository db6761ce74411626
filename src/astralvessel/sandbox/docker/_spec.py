"""What a Docker turn looks like, decided as pure functions over a ``Policy``.

``container_spec`` turns a policy into the engine's container settings (one
container per turn), ``server_argv`` wraps the sandbox server's command in the
user-namespace bootstrap, ``exec_argv`` builds a ``docker-exec`` call's command,
and the label helpers decide which containers are leftovers of dead turns.
Nothing here talks to an engine; the rest of this package does that.

How the promises are kept (see ``docs/docker.md``): the container runs as the
turn's own host uid (leased from the host's range, ``sandbox/_uids``; 65534 on
an engine that maps container uids itself) with no capabilities,
``no-new-privileges``, no network, a read-only root, Docker's seccomp profile
compiled from the ``server`` deny list, and engine-enforced pids, memory, cpu,
``nofile`` and ``fsize`` limits. Its first process creates a user namespace
that maps only that uid to itself; inside it the server holds capabilities
over its own namespaces alone, which is enough to give every call a fresh PID
and mount namespace with its own ``/proc`` and to install the ``calls``
filter. A call is uid 65534 of a user namespace of its own, mapped to the
container's uid, so the kernel clears every capability at exec.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import PurePosixPath

import attrs

from .._cgroup import turn_memory_bytes, turn_pids
from .._policy import AGENT_DIR, EGRESS_DIR, ROOT_DIRS, SYSTEM_DIRS, WORKSPACE_DIR, Policy
from ..server._launch import SIGNALS_PENDING
from ._boot_view import MEMORY_EVENTS_FD, MEMORY_LIMIT_FD
from ._bootstrap import CONNECT_BOOTSTRAP, USERNS_BOOTSTRAP
from ._identity import identity_binds

__all__ = [
    "CALL_GID",
    "CALL_UID",
    "DEFAULT_BASE_IMAGE",
    "EXEC_SETUP_FAILED",
    "IDLE_ARGV",
    "LABEL_MODE",
    "LABEL_OWNER",
    "LABEL_POLICY",
    "LABEL_TURN",
    "MEMORY_EVENTS_FD",
    "MEMORY_LIMIT_FD",
    "READY",
    "USERNS_BOOTSTRAP",
    "VIEW_ROOT",
    "ContainerSpec",
    "carry_bytes",
    "container_spec",
    "context_digest",
    "exec_argv",
    "is_leftover",
    "owner_label",
    "parse_owner",
    "profile_text",
    "ready_argv",
    "server_argv",
    "view_binds",
]

#: The base image when the host names none: a common slim image with ``python3``.
DEFAULT_BASE_IMAGE = "python:3.12-slim"
#: The uid calls see, and the container's uid where the engine maps container uids itself
#: (elsewhere the container runs as the turn's leased uid).
CALL_UID = 65534
CALL_GID = 65534

LABEL_TURN = "org.astralvessel.turn"
LABEL_OWNER = "org.astralvessel.owner"
LABEL_MODE = "org.astralvessel.mode"
LABEL_POLICY = "org.astralvessel.policy"

#: Docker's masked paths outside ``/proc``. Any mask inside ``/proc`` makes the kernel
#: refuse a fresh ``/proc`` in a call's PID namespace, so none is kept there; nothing in
#: the container ever runs as root, so the masks would protect nothing in ``/proc``.
MASKED_PATHS = ("/sys/firmware", "/sys/devices/virtual/powercap")
#: What an exec call must not see: Docker's default masks, what names the host, then /sys and
#: /dev/mqueue whole.
EXEC_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    # What names the host (the server's calls read synthetic ones: server/_init.py).
    "/proc/sys/kernel/random/boot_id",
    "/proc/cmdline",
    "/dev/mqueue",
    "/sys",
)

#: Where Docker mounts the (empty) tmpfs the bootstrap builds the sandbox's root on.
VIEW_ROOT = "/.astralvessel-root"

#: Where the host's folder holding a turn's direct channel (``_direct``) is bound; the
#: server connects to the socket in it first, before building the calls' view (which
#: leaves it out). At the top, beside ``VIEW_ROOT``, not under /run: a writable root
#: binds the image's /run into the view (adduser locks there), and would carry it along.
CHANNEL_DIR = "/.astralvessel-host"
CHANNEL_SOCKET = "server.sock"


@attrs.frozen(kw_only=True)
class ContainerSpec:
    """One turn's container, as the engine's create-container settings."""

    image: str
    command: tuple[str, ...]
    user: str
    environment: Mapping[str, str]
    working_dir: str
    labels: Mapping[str, str]
    #: Keyword arguments of ``docker.APIClient.create_host_config``.
    host_config: Mapping[str, object]
    #: Host-config keys the SDK has no argument for, merged in as-is.
    host_config_extra: Mapping[str, object]
    #: Whether the container's stdin is open and attached: the server's input on the
    #: attach stream, the idle shell's lifeline in ``docker-exec``; a server on a direct
    #: channel reads its socket instead, and its stdin is ``/dev/null``.
    open_stdin: bool = True


def _covered(path: PurePosixPath, targets: Iterable[PurePosixPath]) -> bool:
    return any(path == t or t in path.parents for t in targets)


def profile_text(profile: Mapping[str, object]) -> str:
    """Docker's seccomp profile as the JSON text the engine takes in the security option."""
    return json.dumps(profile, sort_keys=True, separators=(",", ":"))


def container_spec(
    policy: Policy,
    *,
    image: str,
    command: Sequence[str],
    seccomp_profile: Mapping[str, object] | str,
    labels: Mapping[str, str],
    server: bool,
    cpus: float | None = 1.0,
    uid: int = CALL_UID,
    channel_dir: str | None = None,
    identity_dir: str | None = None,
    workspace: str | None = None,
) -> ContainerSpec:
    """The container of one turn for ``policy``, whose calls are host ``uid`` (and gid).

    ``server`` is true when the sandbox server runs as the container's process;
    false for ``docker-exec``, where an idle root process without capabilities
    holds the container open (root, so that calls, which run as another uid,
    cannot signal it; ``IDLE_ARGV``), and each call is a ``docker exec`` as
    ``uid``. ``identity_dir`` (``docker-exec``) holds the turn's passwd and
    group files, bound over the image's (``_identity``). ``seccomp_profile``
    is Docker's JSON profile, or its text as ``profile_text`` renders it.
    ``workspace``: the host's overlay of a snapshot (``_cow``), bound as the
    workspace in place of the container's own tmpfs.
    """
    limits = policy.limits
    mib = 1024 * 1024
    disk_bytes = limits.disk_mb * mib
    binds: list[str] = []
    targets: list[PurePosixPath] = [WORKSPACE_DIR]
    if policy.agent_dir is not None:
        binds.append(f"{policy.agent_dir}:{AGENT_DIR}:ro")
        targets.append(AGENT_DIR)
    for mount in sorted(policy.mounts, key=lambda m: (len(m.target.parts), str(m.target))):
        binds.append(f"{mount.source}:{mount.target}:{'rw' if mount.writable else 'ro'}")
        targets.append(mount.target)
    if policy.egress_socket is not None and server:
        # The host egress proxy's socket folder, for the server's relay (see ``_relay``).
        binds.append(f"{policy.egress_socket.parent}:{EGRESS_DIR}:ro")
    if channel_dir is not None and server:
        # The host's folder of the turn's direct channel (``_direct``), for the server only.
        binds.append(f"{channel_dir}:{CHANNEL_DIR}:ro")
    if identity_dir is not None and not server:
        # The server maps a call's ids to a user every passwd names; an exec has no server.
        binds += identity_binds(identity_dir)
    if workspace is not None:
        # The host made it as the tmpfs below would be (nosuid, nodev, disk_mb, the call
        # user's), with the snapshot's tree as its overlay's lower layer; a bind keeps those.
        binds.append(f"{workspace}:{WORKSPACE_DIR}:rw")
    tmpfs: dict[str, str] = {}
    if workspace is None:
        # The turn's only writable place: owned by the call user, at most the disk limit.
        # "exec" because Docker's tmpfs is noexec unless told: a harness builds and runs
        # programs here, as it can on bubblewrap and nsjail (noexec would stop only
        # "./prog", never "sh prog" or "python3 prog"; confinement does not rest on it).
        tmpfs[str(WORKSPACE_DIR)] = (
            f"rw,exec,nosuid,nodev,size={disk_bytes},nr_inodes={limits.workspace_inodes},"
            f"mode=0755,uid={uid},gid={uid}"
        )
    if not _covered(policy.workdir, targets):
        # A workdir nobody mounted still exists, empty and read-only, so calls can start in it.
        tmpfs[str(policy.workdir)] = "ro,nosuid,nodev,size=4096,mode=0755"
    if server:
        # An empty mount point the bootstrap mounts its own tmpfs root on.
        tmpfs[VIEW_ROOT] = "ro,nosuid,nodev,size=4096,mode=0755"
    # The workspace tmpfs is charged to the container's memory, so a full workspace
    # must not be what pushes the server out of memory: the same bound as the turn
    # cgroup of the namespace backends.
    memory = turn_memory_bytes(limits)
    profile = seccomp_profile if isinstance(seccomp_profile, str) else profile_text(seccomp_profile)
    host_config: dict[str, object] = {
        "network_mode": "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", f"seccomp={profile}"],
        "ulimits": [
            {"Name": "nofile", "Soft": limits.open_files, "Hard": limits.open_files},
            {"Name": "fsize", "Soft": disk_bytes, "Hard": disk_bytes},
            {"Name": "core", "Soft": 0, "Hard": 0},
            # As the server sets for each call (_launch.SIGNALS_PENDING): docker-exec's
            # calls get only the container's.
            {"Name": "sigpending", "Soft": SIGNALS_PENDING, "Hard": SIGNALS_PENDING},
            {"Name": "msgqueue", "Soft": 0, "Hard": 0},
        ],
        "pids_limit": turn_pids(limits),
        "mem_limit": memory,
        "memswap_limit": memory,
        "tmpfs": tmpfs,
        "binds": binds,
        # No IPC namespace shared with anyone, and no /dev/shm for POSIX shared memory.
        "ipc_mode": "none",
        "log_config": {"Type": "none", "Config": {}},
    }
    if cpus is not None:
        host_config["nano_cpus"] = int(cpus * 1e9)
    # The server builds each call's view itself; an exec sees the container's, so Docker's
    # own masks stay and /sys and the POSIX message queues are hidden too.
    extra: dict[str, object] = (
        {"MaskedPaths": list(MASKED_PATHS), "ReadonlyPaths": []}
        if server
        else {"MaskedPaths": list(EXEC_MASKED_PATHS)}
    )
    return ContainerSpec(
        image=image,
        command=tuple(command),
        user=f"{uid}:{uid}" if server else "0:0",
        environment=dict(policy.environment),
        working_dir=str(policy.workdir) if server else "/",
        labels=dict(labels),
        host_config=host_config,
        host_config_extra=extra,
        open_stdin=not (server and channel_dir is not None),
    )


def view_binds(policy: Policy) -> list[str]:
    """The turn's paths bound into the sandbox's root, parents before children."""
    paths = [str(WORKSPACE_DIR)]
    if policy.agent_dir is not None:
        paths.append(str(AGENT_DIR))
    paths += [str(m.target) for m in policy.mounts]
    if policy.egress_socket is not None:
        paths.append(str(EGRESS_DIR))
    paths.append(str(policy.workdir))
    unique = dict.fromkeys(paths)
    return sorted(unique, key=lambda p: (len(PurePosixPath(p).parts), p))


def server_argv(command: Sequence[str], policy: Policy, *, direct: bool = False) -> list[str]:
    """Wrap the server's ``python -c CODE`` command so the namespace bootstrap runs first.

    The bootstrap must run in the server's own process: capabilities gained by
    creating a user namespace would be lost across an ``exec`` by a non-root uid.
    ``direct``: before it, the server connects its stdin and stdout to the
    host's socket in ``CHANNEL_DIR`` (bound by ``container_spec(channel_dir=)``).
    """
    argv = list(command)
    try:
        index = argv.index("-c")
    except ValueError:
        raise ValueError(f"the server command {argv!r} has no '-c CODE' to wrap") from None
    if index + 1 >= len(argv):
        raise ValueError(f"the server command {argv!r} ends at '-c'")
    code = argv[index + 1]
    root_dirs = [str(d) for d in ROOT_DIRS] if policy.writable_root else []
    call = (
        f"_astralvessel_view({view_binds(policy)!r}, {[str(d) for d in SYSTEM_DIRS]!r}, "
        f"{VIEW_ROOT!r}, {str(policy.workdir)!r}, {root_dirs!r})\ndel _astralvessel_view\n"
    )
    connect = (
        CONNECT_BOOTSTRAP
        + f"_astralvessel_connect({CHANNEL_DIR + '/' + CHANNEL_SOCKET!r})\n"
        + "del _astralvessel_connect\n"
        if direct
        else ""
    )
    argv[index + 1] = (
        connect
        + USERNS_BOOTSTRAP
        + call
        + f"\nexec(compile({code!r}, '<astralvessel-server>', 'exec'), "
        + "{'__name__': '__main__', '__builtins__': __builtins__})\n"
    )
    return argv


#: A ``docker-exec`` container's first process: it holds the container open until its
#: stdin (the host's attach stream) ends, and reaps every orphan of the calls. Killed
#: calls' processes are reparented to it, and a shell blocked in ``read`` never waits
#: for them: their zombies would pile up against the turn's pids bound and its uid's
#: ``ulimit -p`` until no call could fork. So ``read`` runs as a job (on the real stdin,
#: kept as fd 3: a job's own stdin is ``/dev/null``) and the shell ``wait``s, which reaps
#: any child. The engine's init (docker-init's tini) cannot be used: it calls
#: ``setpgid``, which the ``calls`` seccomp profile every process here runs under refuses.
IDLE_ARGV = ("/bin/sh", "-c", "exec 3<&0; read _ignored <&3 & wait")

#: What every ``docker-exec`` command writes to stdout first (the host strips it): the
#: engine answers an exec before ``runc exec`` has run, and this byte pair says it has.
READY = b"\x1e\x1f"
#: ``READY`` as ``printf`` writes it.
_READY_PRINTF = "printf '\\036\\037'"


def ready_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` run by a shell that first writes ``READY`` (a ``docker-exec`` helper command)."""
    return ["/bin/sh", "-c", f'{_READY_PRINTF} && exec "$@"', "sh", *argv]


#: Run first by a ``docker-exec`` command whose words are not all UTF-8: its first word
#: flags (``1``) each following word that came as ``printf %b`` text, and each is put back
#: as its bytes, in place (``$(...)`` drops trailing newlines, hence the ``_``).
_BYTES_PRELUDE = (
    'f=$1; shift; for a do shift; case $f in 1*) a=$(printf "%b_" "$a"); a=${a%_};; esac; '
    'f=${f#?}; set -- "$@" "$a"; done; '
)


def _printf_text(raw: bytes) -> str:
    """``raw`` as ``printf %b`` reads it back: printable ASCII as it is, other bytes in octal."""
    return "".join(
        "\\\\" if byte == 0x5C else chr(byte) if 0x20 <= byte < 0x7F else f"\\0{byte:03o}"
        for byte in raw
    )


def carry_bytes(script: str, words: Sequence[str], *, first: str = "") -> list[str]:
    """``sh -c first+script`` with ``words`` as its arguments, each arriving as its exact bytes.

    The engine takes an exec's command as JSON text, which can only carry
    UTF-8: ``os.fsdecode``'s escape of a byte that is not UTF-8 would arrive as
    U+FFFD. Words that are not valid UTF-8 therefore travel as ``printf %b``
    text (ASCII) and the shell turns them back into their bytes before the
    script runs (``first`` runs before that). Commands of UTF-8 words alone are
    sent as they are.
    """
    raw = [word.encode("utf-8", "surrogateescape") for word in words]
    flags = ["0" if _is_utf8(word) else "1" for word in raw]
    if "1" not in flags:
        return ["/bin/sh", "-c", first + script, "sh", *words]
    carried = [
        word if flag == "0" else _printf_text(data)
        for word, data, flag in zip(words, raw, flags, strict=True)
    ]
    return ["/bin/sh", "-c", first + _BYTES_PRELUDE + script, "sh", "".join(flags), *carried]


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


#: Exit code of a ``docker-exec`` command whose wrapper failed before the command ran:
#: the server's own for a call it could not set up (``server._launch.EXIT_SETUP_FAILED``).
EXEC_SETUP_FAILED = 125
#: Set first by every ``docker-exec`` call's shell: any way it ends before its ``exec``
#: succeeds (a fork, a limit or an exec refused, the outbox folder not made) says so and
#: exits ``EXEC_SETUP_FAILED``. Without it dash exits 2 after a failed fork (``Cannot
#: fork``, fatal even inside ``&&``), a refused ``ulimit`` or an ``exec`` failing other
#: than as not found or not executable: the code a command's own misuse error has.
_SETUP_TRAP = (
    "trap 'echo \"astralvessel: the sandbox could not start the command (the line above "
    f"says why); it did not run\" >&2; exit {EXEC_SETUP_FAILED}' EXIT; "
)


def exec_argv(
    policy: Policy,
    argv: Sequence[str],
    *,
    outbox: str | None = None,
    env: Mapping[str, str] | None = None,
    split: bool = False,
    cwd: str | None = None,
) -> list[str]:
    """The ``docker-exec`` command of one call: its outbox, its limits, exactly the policy's env.

    ``outbox`` is the call's own outbox folder (``$VESSEL_OUTBOX``), made
    first. The container's limits are the whole turn's; ``sh`` adds the call's
    own address-space and process limits (as the server does per call; with no
    init of its own, the call itself is the first of its ``processes``), then
    ``env -i`` drops what Docker and ``sh`` add to every exec (``HOSTNAME``,
    the image's variables, ``PWD``), and stderr joins stdout in order, unless
    ``split`` (a host's ``Turn.exec``, whose ``env`` is set over the policy's).
    ``cwd``, when given, is entered by ``sh`` (a missing one fails as 126 with
    the shell's message on stderr, not the engine's on stdout). ``READY`` comes
    first on stdout. Words that are not UTF-8 (``os.fsdecode``'s escapes) arrive
    as their bytes (``carry_bytes``). The outbox folder's path is a word too,
    never script text. If the shell fails before its ``exec`` (any step, a fork
    refused by the turn's process bounds among them), the command exits
    ``EXEC_SETUP_FAILED`` with a line on stderr saying it did not run.
    """
    limits = policy.limits
    environment = dict(policy.environment, **(env or {}))
    if outbox is not None:
        environment["VESSEL_OUTBOX"] = outbox
    assignments = [f"{name}={value}" for name, value in environment.items()]
    enter = f"{_READY_PRINTF}; " + (
        'cd -- "$1" || { trap - EXIT; exit 126; }; shift; ' if cwd is not None else ""
    )
    # The outbox folder first made again if an earlier call left a link or a file at its name:
    # mkdir -p would follow the link (as the call's own user, but every later call would
    # write its outbox files wherever it points, or fail).
    script = enter + (
        'umask 007 && { [ -d "$1" ] && [ ! -L "$1" ] || rm -f -- "$1"; } && '
        'mkdir -p -- "$2" && shift 2 && '
        f"ulimit -v {limits.memory_mb * 1024} && ulimit -p {limits.processes} && "
        'exec env -i "$@"' + ("" if split else " 2>&1")
    )
    entered = [cwd] if cwd is not None else []
    words = [*entered, str(policy.environment["VESSEL_OUTBOX"]), environment["VESSEL_OUTBOX"]]
    words += [*assignments, *argv]
    return carry_bytes(script, words, first=_SETUP_TRAP)


def owner_label(hostname: str, pid: int, start_time: str) -> str:
    """Name the host process that owns a turn's container: ``host:pid:start``."""
    return f"{hostname}:{pid}:{start_time}"


def parse_owner(label: str) -> tuple[str, int, str] | None:
    """Split an owner label; ``None`` if it is not one."""
    host, sep, rest = label.rpartition(":")
    host, sep2, pid_text = host.rpartition(":")
    if not sep or not sep2 or not pid_text.isdigit():
        return None
    return host, int(pid_text), rest


def is_leftover(
    labels: Mapping[str, str], hostname: str, start_time_of: Callable[[int], str | None]
) -> bool:
    """Whether a labelled container belongs to a dead host process on this machine.

    ``start_time_of(pid)`` returns the process's start time, or ``None`` if no
    such process exists; a pid reused by another process has another start time.
    Containers owned by other machines (a shared remote engine) are never touched.
    """
    if LABEL_TURN not in labels:
        return False
    owner = parse_owner(labels.get(LABEL_OWNER, ""))
    if owner is None:
        return False
    host, pid, started = owner
    return host == hostname and start_time_of(pid) != started


def context_digest(
    files: Iterable[tuple[str, int, bytes]], *, dockerfile: str, base_image_id: str
) -> str:
    """Hash a build context (each file's path, mode, content), the Dockerfile and base image."""
    digest = hashlib.sha256()
    digest.update(f"dockerfile\0{dockerfile}\0base\0{base_image_id}\0".encode())
    for path, mode, content in sorted(files):
        digest.update(f"{path}\0{mode:o}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()[:16]

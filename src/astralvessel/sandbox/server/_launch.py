"""Starting one call: fork, confine, exec (stdlib only, Python 3.8+).

Confined, a call runs under one process of ours: its *init*, pid 1 of a fresh
PID namespace, which the zygote (see ``_zygote``) forks with
``fork_chain``. Init makes a mount namespace of its own and mounts a fresh
``/proc`` (so the call sees only its own processes), confines itself (rlimits,
the unprivileged uid, ``no_new_privs``, the seccomp filter) and starts the
*command* as its child. Everything the kernel passes on to a child (limits,
credentials, the filter) the command inherits, so init can start it with
``posix_spawn`` (a vfork and an exec: no copy of this Python process to make
or to tear down) and fall back to fork and exec when that is refused. When the
command exits, init kills everything left in its namespace, reaps it all and
says so; a daemon or a double fork is gone before the call returns. The
command is not pid 1 itself, so signals and orphan reaping behave as the
program expects; and pid 1 ignores every signal sent from inside its own
namespace, so the call cannot kill the init that watches it.

A detached call (``Turn.start``) is the one exception: its init reports the
command's exit, then only reaps, so what the command forked lives on in the
namespace, confined, until it ends by itself or the server kills init.

The forks are the expensive part, and none of them depends on the request. So
``prepare`` has the chain built ahead of time (a *spare*): init gets as far as
the steps that do not change who it is (``no_new_privs`` and the seccomp
filter) and blocks reading its request (working directory and argv) from a
control pipe. ``start`` writes the request; init then sets the limits, drops to
the unprivileged uid and starts the command. The server keeps one spare ready,
so a call's critical path is a pipe write, a few system calls and a vfork.

Unconfined (or confined without namespaces, where the host allowed it), the
command runs as the leader of a new process group that the server kills.

Everything between fork and exec runs in a copy of a single-threaded process,
so plain Python is safe there; each child ends in ``os._exit``.

The module is long on purpose: fork, namespaces, init's confinement order and
the rlimits must be read as one sequence to be audited; only the user
namespace step (``_userns``) and the filter install (``_seccomp``) stand apart.
"""

from __future__ import annotations

import ctypes
import os
import resource
import select
import stat
import warnings  # noqa: F401 - see below

from . import _userns
from ._lean import signal, suppress
from ._sys import (
    CLONE_NEWNS,
    CLONE_NEWPID,
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    check,
    libc,
    mount,
    prctl,
    setns,
    unshare,
)

# os.get_exec_path imports warnings on first use, and a call's init first uses it after
# dropping to a uid that may not read the interpreter's library (the host's Python under
# /root): every module the server's children need is imported here, before any fork.

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "CHAIN_FDS",
    "LaunchPlan",
    "Spawned",
    "chain_alive",
    "exit_code_of",
    "fork_chain",
    "prepare",
    "probe",
    "reset_ignored_signals",
    "spawn",
    "start",
]

# Exit codes of a child that failed before exec, as a shell would report them.
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
EXIT_SETUP_FAILED = 125


def warm() -> None:
    """Load libc and look up every function a call needs, so each fork inherits them ready.

    Loading libc and resolving a symbol through ctypes costs about a millisecond
    on a small VM; done once in the server, no call pays it again.
    """
    lib = libc()
    for name in ("unshare", "setns", "mount", "umount2", "prctl", "capset"):
        getattr(lib, name)
    _userns.warm()


def release_free_memory() -> None:
    """Give the C allocator's free pages back to the kernel (glibc's ``malloc_trim``).

    The server frees much of what it read at start (its payload, the hello), and
    an allocator keeps freed pages: resident, and counted in every idle turn's
    memory. Best effort: another C library may have no ``malloc_trim``.
    """
    with suppress(AttributeError, OSError):
        libc().malloc_trim(0)


def exit_code_of(status: int) -> int:
    """Turn a wait status into an exit code; a signal N becomes -N.

    (``os.waitstatus_to_exitcode`` is Python 3.9+.)
    """
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def has_exited(pid: int) -> bool:
    """Reap ``pid`` if it has exited (a child that is already gone counts as exited)."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return reaped != 0


class LaunchPlan:
    """How this server starts every call, fixed at ``hello`` and refined by the probe."""

    def __init__(
        self,
        *,
        confine: bool,
        pid_namespace: bool,
        drop_uid: int | None,
        drop_gid: int | None,
        limits: dict[str, int] | None,
        seccomp: bytes | None,
        install_seccomp: Callable[[bytes], None] | None,
        own_userns: bool = True,
        inner_id: int = _userns.CALL_ID,
        terminals: bool = False,
    ) -> None:
        self.confine = confine
        self.pid_namespace = pid_namespace
        self.drop_uid = drop_uid
        self.drop_gid = drop_gid
        self.limits = limits
        self.seccomp = seccomp
        self.install_seccomp = install_seccomp
        #: Whether each call's init enters a user namespace of its own (see ``_userns``);
        #: only with a PID namespace, and off where the probe found it cannot.
        self.own_userns = own_userns
        #: The uid and gid a call has in its own user namespace (0 for ``root_identity``).
        self.inner_id = inner_id
        #: Each call gets pseudo-terminals of its own devpts instance (``tool_servers``).
        self.terminals = terminals
        #: The gid, when an exec's user (``with_identity``) has one apart from its uid.
        self.inner_gid: int | None = None

    def with_identity(self, uid: int, gid: int) -> LaunchPlan:
        """This plan for one exec that names a user: ``uid``/``gid`` inside, the rest the same.

        Only the ids the call sees change; they map to the same host identity
        as every other call of the turn (see ``_userns.enter_own_namespace``).
        """
        other = LaunchPlan.__new__(LaunchPlan)
        other.__dict__.update(self.__dict__)
        other.inner_id = uid
        other.inner_gid = gid
        return other


class Spawned:
    """What the server keeps of a call (or a spare): its pipes, and the child to reap.

    ``pid`` is -1 for a namespace call: the zygote forked it and reaps it, and
    the status pipe names its processes.
    """

    def __init__(  # noqa: PLR0917 - plain record of descriptors
        self,
        pid: int,
        output: int,
        stdin: int,
        status: int,
        group: bool,
        control: int = -1,
        errors: int = -1,
    ) -> None:
        self.pid = pid
        self.output = output
        #: The command's stderr when the request splits the streams (an exec); unused otherwise.
        self.errors = errors
        self.stdin = stdin
        self.status = status
        #: What the chain wrote on the status pipe so far (namespace calls).
        self.status_text = b""
        #: True when ``pid`` leads a process group to kill (no PID namespace).
        self.group = group
        #: Write end of a prepared command's request pipe; -1 once the request is sent.
        self.control = control

    def close(self) -> None:
        """Close every descriptor the server still holds for this child."""
        for name in ("output", "errors", "stdin", "status", "control"):
            fd = getattr(self, name)
            if fd >= 0:
                with suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)


def close_fds_except(keep: set[int]) -> None:
    """Close every descriptor above 2 not in ``keep``, so a call never holds another's pipes."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536)))
    for fd in fds:
        if fd > 2 and fd not in keep:
            with suppress(OSError):
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            # A socket to the host (Docker's direct channel) is one open file for reading
            # and writing, so the server's non-blocking read end makes this end so too:
            # wait for room, as a blocking write would.
            waiting = select.poll()
            waiting.register(fd, select.POLLOUT)
            waiting.poll()


def _report(fd: int, line: str) -> None:
    """Send one line to the server on the status pipe; a failure here has nowhere to go."""
    with suppress(OSError):
        _write_all(fd, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))


def _child_signals() -> None:
    """Undo the server's signal setup, which a fork inherits and an exec partly keeps."""
    with suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)


_LIMITS = (
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_AS,
    resource.RLIMIT_NPROC,
    resource.RLIMIT_CORE,
)


def _apply_limits(limits: dict[str, int]) -> None:
    mib = 1 << 20
    wanted = [
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_FSIZE, limits["disk_mb"] * mib),
        (resource.RLIMIT_AS, limits["memory_mb"] * mib),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_CORE, 0),
    ]
    for which, value in wanted:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            # Unprivileged we cannot raise a hard limit: a lower one is stricter, so keep it.
            hard = resource.getrlimit(which)[1]
            low = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (low, low))


_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# Made once: building a ctypes array type takes longer than the system call.
_CapHeader = ctypes.c_uint32 * 2
_CapData = ctypes.c_uint32 * 6


def _clear_inheritable() -> None:
    """Empty every capability set, the inheritable one too (setresuid leaves it as it was)."""
    # nsjail's --keep_caps hands the server a full inheritable set; a call must not carry it.
    check(libc().capset(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), _CapData()), "capset")


def _drop(uid: int | None, gid: int | None) -> None:
    if gid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)
        _clear_inheritable()


def _confine_self(plan: LaunchPlan) -> None:
    """Apply the plan's confinement to this process, in the order that lets each step work."""
    if plan.limits is not None:
        _apply_limits(plan.limits)  # first, while still allowed to raise a hard limit
    _drop(plan.drop_uid, plan.drop_gid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if plan.seccomp is not None:
        if plan.install_seccomp is None:
            raise OSError("the seccomp installer is missing from this server")
        plan.install_seccomp(plan.seccomp)


def _take_pipes(stdin: int, output: int, errors: int, split: bool) -> None:
    """Put the call's pipes on 0, 1 and 2 and close the originals.

    A tool call's stdout and stderr share one pipe (the model reads them as one
    text, in order); an exec (``split``) gets stderr on a pipe of its own.
    """
    os.dup2(stdin, 0)
    os.dup2(output, 1)
    os.dup2(errors if split else output, 2)
    for fd in (stdin, output, errors):
        if fd > 2:
            os.close(fd)


def _wire_command(stdin: int, output: int, errors: int, split: bool) -> None:
    """Reset signals and put the call's pipes on 0, 1 and 2 (none of it needs the request)."""
    _child_signals()
    # A write past RLIMIT_FSIZE then fails with EFBIG, as on a full disk, instead of killing.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _take_pipes(stdin, output, errors, split)


def _confine_and_exec(plan: LaunchPlan, argv: list[str], cwd: str, env: dict[str, str]) -> int:
    """Confine this process, enter ``cwd`` and exec; return the exit code if that fails."""
    if plan.confine:
        _confine_self(plan)
    try:
        os.chdir(cwd)
    except OSError as exc:
        _write_all(2, f"astralvessel: cannot enter {cwd}: {exc.strerror}\n".encode())
        return EXIT_CANNOT_EXECUTE
    try:
        os.execvpe(argv[0], argv, env)  # noqa: S606 - argv, never a shell line
    except OSError as exc:
        _write_all(2, f"astralvessel: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_EXECUTE


def _exec_command(  # noqa: PLR0917 - the child gets everything as plain values
    plan: LaunchPlan,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    stdin: int,
    output: int,
    errors: int,
    status: int,
    split: bool,
) -> None:
    """Become the call's command: wire the pipes, confine, chdir, exec. Never returns."""
    code = EXIT_SETUP_FAILED
    try:
        _wire_command(stdin, output, errors, split)
        code = _confine_and_exec(plan, argv, cwd, env)
    except BaseException as exc:
        _report(status, f"E cannot confine the call: {exc}")
    os._exit(code)


def encode_request(
    argv: list[str],
    cwd: str,
    env: dict[str, str] | None = None,
    *,
    split: bool = False,
    detach: bool = False,
) -> bytes:
    """The request a prepared init reads: ``S`` (stderr apart), ``M`` (merged) or ``B``
    (merged, detached: the namespace outlives the command), the working directory,
    each ``NAME=value`` the call's environment adds (its own ``$VESSEL_OUTBOX``, an
    exec's variables), an empty field, then argv, NUL-separated.

    None of them can hold a NUL (the server refuses such a call), no environment
    entry is empty, and splitting bytes is far less work than parsing JSON on the
    call's critical path.
    """
    entries = [f"{name}={value}" for name, value in (env or {}).items()]
    mode = "B" if detach else "S" if split else "M"
    return b"\0".join(os.fsencode(part) for part in (mode, cwd, *entries, "", *argv))


def _parse_request(data: bytes) -> tuple[list[str], str, dict[str, str], str]:
    mode, cwd, *rest = (os.fsdecode(part) for part in data.split(b"\0"))
    end = rest.index("")
    env = dict(entry.split("=", 1) for entry in rest[:end])
    return rest[end + 1 :], cwd, env, mode


def _read_to_end(fd: int) -> bytes:
    """Read ``fd`` (blocking) until end of file, then close it."""
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _read_request(control: int) -> tuple[list[str], str, dict[str, str], str] | None:
    """Read the whole request from the control pipe; None if the server closed it unused."""
    data = _read_to_end(control)
    return _parse_request(data) if data else None


def _filter_early(plan: LaunchPlan) -> None:
    """The confinement steps that leave init's identity alone: ``no_new_privs``, seccomp."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if plan.seccomp is not None:
        if plan.install_seccomp is None:
            raise OSError("the seccomp installer is missing from this server")
        plan.install_seccomp(plan.seccomp)


def _become_unprivileged(plan: LaunchPlan) -> None:
    """The rest of init's confinement, applied once the request is in: limits, then the uid."""
    if plan.limits is not None:
        # Init runs as the call's uid from here on, so RLIMIT_NPROC counts it too: one more,
        # so that the call's own processes number exactly ``processes``.
        _apply_limits(dict(plan.limits, processes=plan.limits["processes"] + 1))
    if not plan.own_userns:
        _drop(plan.drop_uid, plan.drop_gid)
    # No other process of that uid may read init's memory or descriptors through /proc.
    prctl(PR_SET_DUMPABLE, 0)


def _executable(name: str, env: dict[str, str]) -> str | None:
    """The file ``execvpe`` would run for ``name``, if an obvious one exists; else None."""
    if "/" in name:
        return name
    for directory in os.get_exec_path(env):
        candidate = os.path.join(directory, name)
        try:
            info = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and os.access(candidate, os.X_OK):
            return candidate
    return None


def reset_ignored_signals() -> None:
    """Un-ignore every signal but SIGXFSZ: exec resets handlers, but an ignored signal stays so.

    The zygote does this once for every init it forks (an ignored SIGHUP, say,
    could come all the way from the host application); ``_child_signals`` then
    resets the few the server and the zygote set themselves.
    """
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGXFSZ):
            with suppress(OSError, ValueError):
                if signal.getsignal(sig) == signal.SIG_IGN:
                    signal.signal(sig, signal.SIG_DFL)


def _rehearse(plan: LaunchPlan, env: dict[str, str]) -> None:
    """Walk the request's path once, to no effect, before the request comes.

    Init shares its memory copy-on-write with the processes it was forked from,
    so the first write to each page (Python writes reference counts everywhere)
    costs a page fault and a copy. Taking those here, while the spare waits,
    keeps them off the call's path.
    """
    _parse_request(encode_request(["true"], "/"))
    _executable("true", env)
    if plan.limits is not None:
        for which in _LIMITS:
            with suppress(ValueError, OSError):
                resource.setrlimit(which, resource.getrlimit(which))


def _spawn_command(argv: list[str], env: dict[str, str]) -> int | None:
    """Start the command as this process's child, on this process's 0, 1 and 2; return its pid.

    ``posix_spawn`` first: it shares this process's memory until the exec instead
    of copying it. If it fails for any reason, fork and ``execvpe`` decide, and
    report a command that cannot run exactly as they always have. None if not
    even the fork works (``RLIMIT_NPROC``), after saying so on stderr.
    """
    path = _executable(argv[0], env)
    if path is not None:
        with suppress(OSError):
            return os.posix_spawn(path, argv, env, setsigmask=())
    try:
        pid = os.fork()
    except OSError as exc:
        _write_all(2, f"astralvessel: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        return None
    if pid == 0:
        code = EXIT_SETUP_FAILED
        try:
            try:
                os.execvpe(argv[0], argv, env)  # noqa: S606 - argv, never a shell line
            except OSError as exc:
                _write_all(2, f"astralvessel: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
                code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_EXECUTE
        finally:
            os._exit(code)
    return pid


def _run_request(
    plan: LaunchPlan, env: dict[str, str], fds: dict[str, int]
) -> tuple[int, bool] | None:
    """Wait for the request, confine init, start the command, wait for it; return its
    status and whether the call is detached.

    None when the server threw this spare away unused.
    """
    request = _read_request(fds["control"])
    if request is None:
        return None
    argv, cwd, extra_env, mode = request
    split = mode == "S"
    # Init's own 0, 1 and 2 become the call's pipes, for the command to inherit. Before the
    # limits: a tiny RLIMIT_NOFILE would refuse the dup2.
    _take_pipes(fds["stdin"], fds["output"], fds["errors"], split)
    # The only other descriptor init holds: a call that could write to it could say it was
    # done while still running. (The zygote receives it close-on-exec already.)
    os.set_inheritable(fds["status"], False)
    if plan.confine:
        _become_unprivileged(plan)
    command: int | None = None
    try:
        os.chdir(cwd)
    except OSError as exc:
        _write_all(2, f"astralvessel: cannot enter {cwd}: {exc.strerror}\n".encode())
    else:
        command = _spawn_command(argv, dict(env, **extra_env))
    # Init holds no end of the call's pipes: the output ends when the call's processes do.
    for fd in (0, 1, 2):
        os.close(fd)
    if command is None:
        return EXIT_CANNOT_EXECUTE << 8, mode == "B"
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == command:
            return status, mode == "B"


def _reap_all() -> None:
    """Reap every process of this namespace as it ends, until none is left (pid 1 only).

    A detached call's namespace lives while anything in it does: a server that
    forks and exits leaves its daemon here, re-parented to this init, still
    confined, and killed with the turn.
    """
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _idle_priority() -> None:
    """Run this process only when nothing else wants the CPU (``SCHED_IDLE``); best effort.

    A process may always lower its own priority, but not raise it again, so
    only a process that has nothing left to do on a call's path does this.
    """
    with suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _empty_namespace() -> None:
    """Kill every other process of this PID namespace and reap them all (pid 1 only).

    Every process here descends from init, and an orphan is re-parented to init
    before its parent can be reaped, so once ``waitpid`` finds no child left the
    namespace holds nothing but init. A fork racing the kill cannot slip through:
    the kernel refuses a fork to a process that has a fatal signal pending.
    """
    with suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _private_terminals() -> None:
    """Give this call's mount namespace a /dev with pseudo-terminals of its own (init only).

    The sandbox's /dev has no terminals, and no call may create a node. So init
    builds a new /dev: a read-only tmpfs holding a bind of
    each device of the old one and a devpts instance of its own (``newinstance``),
    whose terminals no other call, turn or the host can reach. The old /dev is
    reached through a scratch tmpfs on /proc, which the fresh /proc then replaces.
    """
    scratch = "/proc"
    mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16k,mode=0700")
    old = scratch + "/dev"
    os.mkdir(old)
    mount("/dev", old, None, MS_BIND | MS_REC)
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in os.listdir(old):
        source, target = f"{old}/{name}", f"/dev/{name}"
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
            continue
        if os.path.isdir(source):
            os.mkdir(target)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
        mount(source, target, None, MS_BIND | MS_REC)
    os.mkdir("/dev/pts")
    mount(
        "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"
    )
    os.symlink("pts/ptmx", "/dev/ptmx")
    # Read-only: where init is the calls' own uid (Docker), its tmpfs would be theirs to fill.
    mount(None, "/dev", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    check(libc().umount2(scratch.encode(), MNT_DETACH), "umount2 /proc")


def _run_init(plan: LaunchPlan, env: dict[str, str], fds: dict[str, int], alive: int) -> None:
    """Pid 1 of the call's namespace: mount /proc, confine, run the command, empty, report.

    Never returns. Reports ``X<status>`` when the command exits and ``D`` once
    the namespace is empty, which is when the server answers the call (a
    detached call's namespace empties by itself, or when init is killed).
    """
    status_fd = fds["status"]
    try:
        # A session of its own, inherited by the command: a call's killpg(0) then reaches
        # only this init (which ignores it) and the call's own tree, never the zygote or
        # the server's group (in Docker the server shares the calls' uid).
        os.setsid()
        prctl(PR_SET_PDEATHSIG, 9)
        # If the zygote died before PDEATHSIG was armed, the write end of this pipe is gone.
        os.set_blocking(alive, False)
        try:
            if os.read(alive, 1) == b"":
                os._exit(1)
        except BlockingIOError:
            pass
        os.close(alive)
        # A mount namespace of its own with private mounts, so this call's /proc never
        # shows up in the sandbox's view or another call's.
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        if plan.terminals:
            _private_terminals()
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        # A write past RLIMIT_FSIZE then fails with EFBIG, as on a full disk, instead of
        # killing; an ignored signal stays ignored across exec.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if plan.confine:
            if plan.own_userns:
                # Before the filter, which refuses new namespaces.
                _userns.enter_own_namespace(
                    plan.drop_uid, plan.drop_gid, plan.inner_id, plan.inner_gid
                )
            _filter_early(plan)
        _rehearse(plan, env)
    except BaseException as exc:
        _report(status_fd, f"E cannot start the call's PID namespace: {exc}")
        os._exit(0)
    detached = False
    try:
        ran = _run_request(plan, env, fds)
        if ran is None:
            os._exit(0)  # a spare the server threw away
        status, detached = ran
        _report(status_fd, f"X{status}")
    except BaseException as exc:
        _report(status_fd, f"E cannot confine the call: {exc}")
    try:
        if detached:
            _reap_all()
        _empty_namespace()
        _report(status_fd, "D")
        # Tearing this process down takes a millisecond or more, likely on the CPU where
        # ``D`` just woke the server: at idle priority the answer goes first. (Not before
        # the report: an idle process waits for every other one before it writes.)
        _idle_priority()
    finally:
        os._exit(0)


#: The descriptors a chain gets, in the order ``prepare`` hands them to ``fork_chain``.
CHAIN_FDS = ("output", "stdin", "status", "control", "errors")


def fork_chain(
    plan: LaunchPlan, env: dict[str, str], child_fds: list[int], *, alive: int, own_pid_ns: int
) -> int:
    """Fork a call's init, pid 1 of a new PID namespace, on ``child_fds``; return its pid.

    ``child_fds`` are in ``CHAIN_FDS`` order and the caller closes them after;
    ``alive`` is the read end of a pipe whose write end only the caller holds
    (init's check that its parent is still there), and ``own_pid_ns`` an open
    descriptor of the caller's PID namespace. ``unshare(CLONE_NEWPID)`` puts
    only the *next* child in a new namespace, and works once, so the caller
    returns to its own namespace (for its children) right after the fork;
    raises ``OSError`` if either step fails, and then the caller cannot fork
    another chain. The caller must reap init.
    """
    unshare(CLONE_NEWPID)
    try:
        pid = os.fork()
        if pid == 0:
            try:
                close_fds_except({*child_fds, alive})
                _child_signals()
                fds = dict(zip(CHAIN_FDS, child_fds))  # noqa: B905 - no strict= before Python 3.10
                _run_init(plan, env, fds, alive)
            finally:
                os._exit(EXIT_SETUP_FAILED)
    finally:
        setns(own_pid_ns, CLONE_NEWPID)
    return pid


def prepare(order: Callable[[list[int]], None]) -> Spawned:
    """Build a call's namespaces and processes up to the exec, waiting for ``start``.

    Only for a plan with a PID namespace. ``order`` forks the chain on the
    child's ends of its pipes (``fork_chain``, usually in the zygote). Returns at
    once; the chain sets itself up in the background, and a request written
    before it is ready just waits in the pipe. Raises ``OSError`` if ``order`` does.
    """
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    st_r, st_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        order([out_w, in_r, st_w, ctl_r, err_w])
    except OSError:
        for fd in (out_r, in_w, st_r, ctl_w, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (out_w, in_r, st_w, ctl_r, err_w):
            os.close(fd)
    for fd in (out_r, in_w, st_r, err_r):
        os.set_blocking(fd, False)
    return Spawned(-1, out_r, in_w, st_r, group=False, control=ctl_w, errors=err_r)


def chain_alive(spawned: Spawned) -> bool:
    """Read what a prepared chain said so far; False once it died, failed or ended."""
    closed = False
    try:
        while True:
            data = os.read(spawned.status, 4096)
            if not data:
                closed = True
                break
            spawned.status_text += data
    except BlockingIOError:
        pass
    said = b"\n" + spawned.status_text
    return not closed and b"\nE" not in said and b"\nD" not in said


def start(
    spawned: Spawned,
    argv: list[str],
    cwd: str,
    env: dict[str, str] | None = None,
    *,
    split: bool = False,
    detach: bool = False,
) -> None:
    """Hand a prepared command its request; it then confines itself and execs.

    Raises ``OSError`` (``BrokenPipeError``) if the prepared chain is gone.
    """
    control, spawned.control = spawned.control, -1
    try:
        _write_all(control, encode_request(argv, cwd, env, split=split, detach=detach))
    finally:
        os.close(control)


def spawn(
    plan: LaunchPlan, argv: list[str], cwd: str, env: dict[str, str], *, split: bool = False
) -> Spawned:
    """Start one call in a process group now and return at once.

    For a plan without PID namespaces; the caller polls the pipes, reaps ``pid``
    and kills its group.
    """
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    st_r, st_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            close_fds_except({out_w, in_r, st_w, err_w})
            os.setpgid(0, 0)
            # Without namespaces nothing else kills a call whose server died;
            # this at least kills its leader.
            prctl(PR_SET_PDEATHSIG, 9)
            _exec_command(plan, argv, cwd, env, in_r, out_w, err_w, st_w, split)
        finally:
            os._exit(EXIT_SETUP_FAILED)
    for fd in (out_w, in_r, st_w, err_w):
        os.close(fd)
    for fd in (out_r, in_w, st_r, err_r):
        os.set_blocking(fd, False)
    return Spawned(pid, out_r, in_w, st_r, group=True, errors=err_r)


def probe(plan: LaunchPlan) -> dict[str, str]:
    """Try every confinement step once in a throwaway child; return each failed step with why.

    Keys: ``pid_namespace`` (unshare, fork, mount /proc), ``unprivileged`` (dropping
    to the uid, or as an ordinary user the call's own user namespace),
    ``user_namespace`` (as root, the call's own user namespace), ``no_new_privs``,
    ``seccomp``, ``rlimits``. Empty means all work.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        problems: dict[str, str] = {}
        try:
            _child_signals()
            _probe_steps(plan, problems, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    report = _read_to_end(read_end)
    os.waitpid(pid, 0)
    found: dict[str, str] = {}
    for line in report.decode("utf-8", "replace").splitlines():
        key, _, why = line.partition(" ")
        found[key] = why
    return found


def _probe_steps(plan: LaunchPlan, problems: dict[str, str], out: int) -> None:
    def fail(key: str, exc: BaseException) -> None:
        _report(out, f"{key} {exc}")

    if plan.pid_namespace:
        _probe_namespaces(plan, fail)
        return
    _probe_confinement(plan, fail)


def _probe_namespaces(plan: LaunchPlan, fail: Callable[[str, BaseException], None]) -> None:
    """Take the zygote's and init's namespace steps, then probe confinement inside them."""
    try:
        # The zygote's launcher: a PID namespace for the zygote.
        unshare(CLONE_NEWPID)
        zygote = os.fork()
    except BaseException as exc:
        fail("pid_namespace", exc)
        return
    if zygote:
        os.waitpid(zygote, 0)
        return
    try:
        # The zygote: a PID namespace for one child, then back to its own.
        own = os.open("/proc/self/ns/pid", os.O_RDONLY)
        unshare(CLONE_NEWPID)
        init = os.fork()
        if init:
            setns(own, CLONE_NEWPID)
            os.waitpid(init, 0)
            os._exit(0)
        # Init: a mount namespace of its own with a fresh /proc.
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except BaseException as exc:
        fail("pid_namespace", exc)
    own_userns = False
    if plan.own_userns:
        try:
            _userns.enter_own_namespace(plan.drop_uid, plan.drop_gid, plan.inner_id)
            own_userns = True
        except BaseException as exc:
            fail(userns_problem(plan), exc)
    try:
        _probe_confinement(plan, fail, dropped=own_userns)
    finally:
        os._exit(0)


def userns_problem(plan: LaunchPlan) -> str:
    """The probe's key for a call's own user namespace that cannot be made.

    Without it, an ordinary user's calls would keep the server's capabilities
    (``unprivileged``); root's calls still drop to the host uid, but share its
    process count with every other turn (``user_namespace``).
    """
    return "unprivileged" if plan.drop_uid is None else "user_namespace"


def _probe_confinement(
    plan: LaunchPlan, fail: Callable[[str, BaseException], None], *, dropped: bool = False
) -> None:
    if plan.limits is not None:
        try:
            _apply_limits(plan.limits)
        except BaseException as exc:
            fail("rlimits", exc)
    if not dropped:
        try:
            _drop(plan.drop_uid, plan.drop_gid)
        except BaseException as exc:
            fail("unprivileged", exc)
    try:
        prctl(PR_SET_NO_NEW_PRIVS, 1)
    except BaseException as exc:
        fail("no_new_privs", exc)
    if plan.seccomp is not None:
        if plan.install_seccomp is None:
            fail("seccomp", OSError("the seccomp installer is missing from this server"))
            return
        try:
            plan.install_seccomp(plan.seccomp)
        except BaseException as exc:
            fail("seccomp", exc)

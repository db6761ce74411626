"""Starting one call: the plan, the pipes, confinement and exec (stdlib only, Python 3.8+).

Confined, a call runs under one process of ours: its *init*, pid 1 of a fresh
PID namespace (``_init``), which the zygote (``_zygote``) forks. The forks are
the expensive part, and none of them depends on the request. So ``prepare`` has
the chain built ahead of time (a *spare*): init gets as far as the steps that do
not change who it is and blocks reading its request (working directory and
argv) from a control pipe. ``start`` writes the request; init then sets the
limits, drops to the unprivileged uid and starts the command. The server keeps
one spare ready, so a call's critical path is a pipe write, a few system calls
and a vfork.

Unconfined (or confined without namespaces, where the host allowed it), the
command runs as the leader of a new process group that the server kills
(``spawn``).

Here live what both ways share: the plan (``LaunchPlan``), what the server keeps
of a call (``Spawned``), the request's encoding, the rlimits, the drop to the
call's uid and the filter's install order. Everything between fork and exec runs
in a copy of a single-threaded process, so plain Python is safe there; each
child ends in ``os._exit``. The system calls are ``_sys``'s, the user namespace
step ``_userns``'s, the filter ``_seccomp``'s, the probe ``_probe``'s.
"""

from __future__ import annotations

import os
import resource
import select

from . import _sys, _userns
from ._lean import signal, suppress
from ._sys import PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, capset, libc, prctl

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "LaunchPlan",
    "Spawned",
    "chain_alive",
    "die_with_parent",
    "exit_code_of",
    "pipe_closed",
    "prepare",
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


def _report(fd: int, *lines: str) -> None:
    """Send lines to the server on the status pipe, in one write; a failure has nowhere to go."""
    text = "".join(line.replace("\n", " ") + "\n" for line in lines)
    with suppress(OSError):
        _write_all(fd, text.encode("utf-8", "replace"))


def _child_signals() -> None:
    """Undo the server's signal setup, which a fork inherits and an exec partly keeps."""
    with suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)


#: Signals a call may have queued (and POSIX timers, each of which holds one queued
#: ahead). The kernel counts them per uid at every user namespace level up to the host's,
#: where an ordinary user's turns and the host process share one count (about 96 000 on
#: a 24 GiB host): a call under the host's limit could take all of it.
SIGNALS_PENDING = 1024


def _apply_limits(limits: dict[str, int]) -> None:
    mib = 1 << 20
    wanted = [
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_FSIZE, limits["disk_mb"] * mib),
        (resource.RLIMIT_AS, limits["memory_mb"] * mib),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_SIGPENDING, SIGNALS_PENDING),
        # POSIX message queues are refused by the filter; none is the bound besides.
        (resource.RLIMIT_MSGQUEUE, 0),
    ]
    for which, value in wanted:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            # Unprivileged we cannot raise a hard limit: a lower one is stricter, so keep it.
            hard = resource.getrlimit(which)[1]
            low = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (low, low))


def die_with_parent(parent_gone: Callable[[], bool]) -> None:
    """Have the kernel SIGKILL this process when its parent dies; exit now if it has already.

    Call it again after every change of identity: the kernel clears the
    parent-death signal whenever a process's effective or filesystem uid or gid
    changes (``_drop``, the ids a call takes in its own user namespace). A
    process that lost it would outlive its parent, on the host when the server
    runs there. ``parent_gone`` is asked only once the signal is armed, so a
    parent that died a moment before cannot slip between the two.
    """
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent_gone():
        os._exit(1)


def pipe_closed(fd: int) -> bool:
    """Whether every write end of the pipe ``fd`` reads from is closed (``fd`` is left
    non-blocking): a parent across a PID namespace, where ``getppid`` says 0, holds one."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1) == b""
    except BlockingIOError:
        return False


def _drop(uid: int | None, gid: int | None) -> None:
    """Take the calls' ``uid`` and ``gid`` (None: keep this process's) and hold no capability.

    Where a process does this, it has no user namespace of its own to leave the
    server's capabilities behind in: without a uid to drop to (an ordinary user's
    server, Docker's) it would keep every one, and with one the bounding set
    would stay full. So it gives up every set, the inheritable one too, which
    nsjail's ``--keep_caps`` fills. Raises ``OSError`` if a step is refused.
    """
    if gid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    # While CAP_SETPCAP is held: past setresuid nothing could empty the bounding set. The
    # locked securebits keep setresuid from clearing the rest, which capset then empties.
    _userns.lock_capabilities()
    if uid is not None:
        os.setresuid(uid, uid, uid)
    capset(0, 0, 0)


def become_call_user(uid: int | None, gid: int | None, *, own_userns: bool, confine: bool) -> None:
    """Take the calls' identity and hold what they hold, as the file worker and the egress
    relay do before they serve: with ``own_userns``, uid 65534 of an own user namespace.

    As an ordinary user (or in Docker) the server is uid 0 of the sandbox's
    namespace with every capability there; a helper gives them all up as a call
    does (holding them, it could open the server's ``/proc/PID/fd`` and ``mem``).
    Where it cannot mount its own ``/proc``, or the calls get no namespace of their
    own, it drops to the calls' uid as they do, and is not dumpable. Unconfined (not
    ``confine``) the calls are the server's equal, and so is the helper. Raises
    ``OSError`` if a step fails: the helper then exits rather than serve with the
    server's privileges.
    """
    if not confine:
        return
    if not own_userns:
        _drop_undumpable(uid, gid)
        return
    try:
        # The ids are mapped through /proc, which nsjail mounts read-only: the helper mounts
        # a /proc of its own (same processes, writable) in a mount namespace of its own.
        _sys.unshare(_sys.CLONE_NEWNS)
        _sys.mount(None, "/", None, _sys.MS_REC | _sys.MS_PRIVATE)
        _sys.mount("proc", "/proc", "proc", _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_NOEXEC)
    except OSError:
        # Docker's masked /proc refuses a new one.
        _drop_undumpable(uid, gid)
        return
    _userns.enter_own_namespace(uid, gid)


def _drop_undumpable(uid: int | None, gid: int | None) -> None:
    """``_drop``, then shut this process's ``/proc`` entries to every process that holds no
    capability over it (raises ``OSError`` as ``_drop`` does).

    A helper that keeps a uid the calls share, holding no capability as they hold
    none, is otherwise theirs to read: a call beside it (no PID namespace of its
    own) could open its memory, or its pipes to the server through ``fd``.
    """
    _drop(uid, gid)
    prctl(PR_SET_DUMPABLE, 0)


def stack_filter(program: bytes | None, install: Callable[[bytes], None] | None) -> None:
    """Stack a helper's own filter (``_seccomp.HELPERS`` on the host) over the server's.

    The file worker and the egress relay call this last, right before they read
    what a model sent; ``program`` None (the turn's calls get no filter either)
    installs nothing. Raises ``OSError`` if it cannot be installed: the helper
    then exits rather than serve under the server's filter alone.
    """
    if program is None:
        return
    if install is None:
        raise OSError("the seccomp installer is missing from this server")
    install(program)


def _confine_self(plan: LaunchPlan) -> None:
    """Apply the plan's confinement to this process, in the order that lets each step work."""
    if plan.limits is not None:
        _apply_limits(plan.limits)  # first, while still allowed to raise a hard limit
    # The server, or this process would have died with it (``spawn`` armed the signal).
    parent = os.getppid()
    _drop(plan.drop_uid, plan.drop_gid)
    # The drop cleared the parent-death signal; armed again, the exec keeps it.
    die_with_parent(lambda: os.getppid() != parent)
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
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            close_fds_except({out_w, in_r, st_w, err_w})
            os.setpgid(0, 0)
            # Without namespaces nothing else kills a call whose server died;
            # this at least kills its leader.
            die_with_parent(lambda: os.getppid() != server)
            _exec_command(plan, argv, cwd, env, in_r, out_w, err_w, st_w, split)
        finally:
            os._exit(EXIT_SETUP_FAILED)
    for fd in (out_w, in_r, st_w, err_w):
        os.close(fd)
    for fd in (out_r, in_w, st_r, err_r):
        os.set_blocking(fd, False)
    return Spawned(pid, out_r, in_w, st_r, group=True, errors=err_r)

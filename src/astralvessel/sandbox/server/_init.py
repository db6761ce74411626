"""A call's init: pid 1 of the call's own PID namespace (stdlib only, Python 3.8+).

The zygote (``_zygote``) forks each init with ``fork_chain``. Init makes a mount
namespace of its own and mounts a fresh ``/proc`` (so the call sees only its own
processes), gives the call its own terminals if the turn asked, enters the
call's own user namespace (``_userns``), takes the confinement steps that leave
its identity alone (``no_new_privs``, the seccomp filter) and waits for its
request on the control pipe: as a *spare*, built before any call needs it. The
request in, init sets the limits, drops to the call's uid and starts the command
as its child (``posix_spawn``, or fork and exec when that is refused). When the
command exits, init reports ``X<status>``, kills everything left in its
namespace, reaps it all and reports ``D``; a detached call's init (``Turn.start``)
reports the exit, then only reaps, so what the command forked lives on, confined,
until it ends or the server kills init (a command that left nothing running has
its exit and ``D`` reported together).

The command is not pid 1 itself, so signals and orphan reaping behave as the
program expects; and pid 1 ignores every signal sent from inside its own
namespace, so the call cannot kill the init that watches it.

This is one sequence on purpose: init's confinement order must be read whole
to be audited. The steps it shares with a call started without namespaces
(limits, the uid drop, the pipes) live in ``_launch``.
"""

from __future__ import annotations

import os
import stat
import warnings  # noqa: F401 - see below

from . import _userns
from ._launch import (
    EXIT_CANNOT_EXECUTE,
    EXIT_NOT_FOUND,
    EXIT_SETUP_FAILED,
    LaunchPlan,
    _apply_limits,
    _child_signals,
    _drop,
    _read_to_end,
    _report,
    _take_pipes,
    _write_all,
    close_fds_except,
    die_with_parent,
    pipe_closed,
)
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
    check,
    libc,
    mount,
    prctl,
    setns,
    unshare,
)

# os.get_exec_path imports warnings on first use, and a call's init first uses it after
# dropping to a uid that may not read the interpreter's library (the host's Python under
# /root): every module the server's children need is imported before any fork.

__all__ = ["CHAIN_FDS", "fork_chain"]


def _parse_request(data: bytes) -> tuple[list[str], str, dict[str, str], str]:
    mode, cwd, *rest = (os.fsdecode(part) for part in data.split(b"\0"))
    end = rest.index("")
    env = dict(entry.split("=", 1) for entry in rest[:end])
    return rest[end + 1 :], cwd, env, mode


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
    plan: LaunchPlan, env: dict[str, str], fds: dict[str, int], alive: int
) -> tuple[int, bool] | None:
    """Wait for the request, confine init, start the command, wait for it; return its
    status and whether the call is detached.

    None when the server threw this spare away unused. ``alive``: see ``_run_init``.
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
        if not plan.own_userns:
            die_with_parent(lambda: pipe_closed(alive))  # the drop to the call's ids cleared it
    os.close(alive)
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


def _alone() -> bool:
    """Whether init is the only process left in its namespace (pid 1 only); reaps what
    has already ended. An orphan is re-parented to init before its parent can be
    reaped, so after the command's reaping no child means nothing runs."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


#: The kernel's OOM killer takes the call's processes before any other of the turn.
_OOM_SCORE_ADJ = b"1000"


def _first_to_die() -> None:
    """Make this call, and all it forks, the memory cgroup's first victims; best effort.

    Where the turn has a memory group (as root, Docker), a call that fills it with
    what the memory watch cannot see or stop in time (pipe buffers, a burst between
    two samples) would otherwise have the kernel kill whichever process is largest:
    the server, and the whole turn with it. Raising one's own score needs no
    privilege; set while init is still privileged (as root) it is also the
    floor the call cannot lower again.
    """
    with suppress(OSError):
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, _OOM_SCORE_ADJ)
        finally:
            os.close(fd)


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
    _reap_all()


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


#: The boot id every call reads. The host's (``/proc/sys/kernel/random/boot_id``) is the
#: same for every process until the host reboots, so it would tell hosts, and a host's
#: turns, apart, as the synthetic machine id of ``/etc`` is meant to stop.
BOOT_ID = "3c0f4a52-8d1e-4b7a-9e26-5f1d0c7b8a94\n"
#: Files of a call's /proc that name the host, and what the call reads there instead
#: (the kernel's command line holds the root disk's UUID, console and boot options).
SYNTHETIC_PROC = (
    ("/proc/sys/kernel/random/boot_id", BOOT_ID),
    ("/proc/cmdline", "\n"),
)


def _fresh_proc() -> None:
    """Mount the call's own /proc (init only), with each ``SYNTHETIC_PROC`` file bound over
    the host's.

    The files are written on a scratch tmpfs over the fresh /proc's ``fs``
    folder, bound, and the scratch unmounted (each bind keeps its file), so the
    call's mountinfo shows only the binds.
    """
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    mount("proc", "/proc", "proc", flags)
    scratch = "/proc/fs"
    mount("tmpfs", scratch, "tmpfs", flags, "size=8k,nr_inodes=8,mode=0700")
    for number, (target, content) in enumerate(SYNTHETIC_PROC):
        made = f"{scratch}/{number}"
        fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.write(fd, content.encode())
        finally:
            os.close(fd)
        mount(made, target, None, MS_BIND)
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | flags)
    check(libc().umount2(scratch.encode(), MNT_DETACH), "umount2 " + scratch)


def _run_init(
    plan: LaunchPlan, env: dict[str, str], fds: dict[str, int], alive: int, mapper: int
) -> None:
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
        # Init dies with the zygote, and the kernel then empties its namespace. Only the
        # zygote holds the write end of ``alive``: closed, the zygote died before the signal
        # was armed. (Across the PID namespace getppid() says 0.) Every change of init's ids
        # below clears the signal, so each arms it again, while ``alive`` is still open.
        die_with_parent(lambda: pipe_closed(alive))
        # A mount namespace of its own with private mounts, so this call's /proc never
        # shows up in the sandbox's view or another call's.
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        if plan.terminals:
            _private_terminals()
        _fresh_proc()
        _first_to_die()  # through the call's own /proc: nsjail mounts the sandbox's read-only
        # A write past RLIMIT_FSIZE then fails with EFBIG, as on a full disk, instead of
        # killing; an ignored signal stays ignored across exec.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if plan.confine:
            if plan.own_userns:
                # Before the filter, which refuses new namespaces.
                _userns.enter_own_namespace(
                    plan.drop_uid, plan.drop_gid, plan.inner_id, plan.inner_gid, mapper=mapper
                )
                die_with_parent(lambda: pipe_closed(alive))
            _filter_early(plan)
        # The zygote's map socket, before any request: no call may reach the zygote.
        os.close(mapper)
        # No rehearsal of the request's path here: its copies (about 0.2 MiB) would sit in
        # every idle turn's spare, where a call takes them in about 0.1 ms (docs: scaling).
    except BaseException as exc:
        _report(status_fd, f"E cannot start the call's PID namespace: {exc}")
        os._exit(0)
    detached = False
    # What goes to the server with ``D``: the command's exit, for a call that is not
    # detached. The server answers on ``D`` alone, so one write wakes it once, not twice.
    exited: list[str] = []
    try:
        ran = _run_request(plan, env, fds, alive)
        if ran is None:
            os._exit(0)  # a spare the server threw away
        status, detached = ran
        if detached and not _alone():
            _report(status_fd, f"X{status}")  # the host hears of it now; the rest lives on
        else:
            # With ``D`` in one write: a detached process that left nothing running stops
            # counting against the turn's bound as the host hears of its exit, not later.
            exited.append(f"X{status}")
    except BaseException as exc:
        _report(status_fd, f"E cannot confine the call: {exc}")
    try:
        if detached:
            _reap_all()
        _empty_namespace()
        _report(status_fd, *exited, "D")
        # Tearing this process down takes a millisecond or more, likely on the CPU where
        # ``D`` just woke the server: at idle priority the answer goes first. (Not before
        # the report: an idle process waits for every other one before it writes.)
        _idle_priority()
    finally:
        os._exit(0)


#: The descriptors a chain gets, in the order ``prepare`` hands them to ``fork_chain``.
CHAIN_FDS = ("output", "stdin", "status", "control", "errors")


def fork_chain(
    plan: LaunchPlan,
    env: dict[str, str],
    child_fds: list[int],
    *,
    alive: int,
    own_pid_ns: int,
    mapper: int,
) -> int:
    """Fork a call's init, pid 1 of a new PID namespace, on ``child_fds``; return its pid.

    ``child_fds`` are in ``CHAIN_FDS`` order and the caller closes them after;
    ``alive`` is the read end of a pipe whose write end only the caller holds
    (init's check that its parent is still there), ``mapper`` the end of the
    socket on which init asks the caller to map its user namespace's ids
    (``_userns.enter_own_namespace``), and ``own_pid_ns`` an open
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
                close_fds_except({*child_fds, alive, mapper})
                _child_signals()
                fds = dict(zip(CHAIN_FDS, child_fds))  # noqa: B905 - no strict= before Python 3.10
                _run_init(plan, env, fds, alive, mapper)
            finally:
                os._exit(EXIT_SETUP_FAILED)
    finally:
        setns(own_pid_ns, CLONE_NEWPID)
    return pid
